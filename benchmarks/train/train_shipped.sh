#!/usr/bin/env bash
# The drafters that ship with foretell for SmolLM2-135M-Instruct (src/foretell/shipped), trained on broad data:
# the target's own answers to 2656 ShareGPT and 1200 GSM8K training prompts (greedy, bf16; they ship gzipped in
# benchmarks/data/self_data), 2000 GSM8K training solutions and 3000 packed rows of ShareGPT conversations as
# written (the target's distribution at every position of any text is a training signal, not only on its own
# answers). No evaluation prompt gets in: the data step drops every conversation that shares text with one
# (OUT/data/report.json). On 2 CPU cores:
#   self data       unpacked from benchmarks/data/self_data (FRESH=1 decodes them again: ~1.5 h, resumable)
#   feature pass    8856 sequences x 320 tokens, bf16                           ~1 h, ~10 GB in OUT/features
#   training        STEPS (3000) x 16 sequences x 32 anchors                    ~2 h
# Every stage resumes: rerun the same command after an interruption. Then ship it with benchmarks/ship/ship_drafter.py
# (the command is printed at the end). Environment: OUT (runs/shipped/smollm2-head), STEPS, THREADS, BF16 (auto: bf16
# training where this CPU multiplies bf16 natively, else fp32; bf16_flag.sh), LR (1e-3), INIT_HEAD (a warm start from
# a trained head of the same shape, e.g. src/foretell/shipped/smollm2-135m-head), SHAREGPT_ROWS / GSM8K_ROWS (a wider
# mix: shipped_data.sh) and FEATURES_FROM (a run folder on the same data, e.g. the wide EAGLE-3 run
# runs/eagle3/smollm2-wide, whose data and feature cache are linked rather than rebuilt: the two heads read the same
# target layers), HEAD_LAYERS (1) and DRAFT_VOCAB (0: the whole vocabulary; benchmarks/train/head_capacity.sh varies both).
set -euo pipefail
source "$(dirname "$0")/shipped_data.sh"
$F self-data --data sharegpt --num-prompts 2656 --max-new-tokens 192 --threads "$T" --out $D/smollm2-sharegpt.jsonl
OUT=${OUT:-runs/shipped/smollm2-head}
mkdir -p "$OUT"
for part in data features; do
  if [ -n "${FEATURES_FROM:-}" ] && [ ! -e "$OUT/$part" ]; then ln -s "$(realpath "$FEATURES_FROM/$part")" "$OUT/$part"; fi
done
$F train parallel-head --target smollm2-135m --data "$SHIPPED_DATA" \
  --eval-data $D/smollm2-mix-test.jsonl --seq-len 320 --depth 4 --head-layers "${HEAD_LAYERS:-1}" --anchors 32 --depth-decay 0.8 \
  --topk-teacher 32 --feature-dtype bfloat16 --steps "${STEPS:-3000}" --warmup 100 --batch-size 16 --lr "${LR:-1e-3}" $(bf16_flag "$OUT") \
  --draft-vocab "${DRAFT_VOCAB:-0}" ${INIT_HEAD:+--init-head "$INIT_HEAD"} --checkpoint-every 50 --eval-sequences 72 --threads "$T" --out "$OUT"
echo "ship it: .venv/bin/python benchmarks/ship/ship_drafter.py --run $OUT --kind parallel-head --name smollm2-135m-head" \
  "--target smollm2-135m --command 'bash benchmarks/train/train_shipped.sh' --speculative" \
  "'{\"method\": \"parallel-head\", \"budget\": \"auto\", \"result_cache\": \"prompt\"}'"
