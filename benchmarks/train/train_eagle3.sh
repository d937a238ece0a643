#!/usr/bin/env bash
# Trains an EAGLE-3 head for SmolLM2-135M-Instruct on the data and budget of the shipped parallel head
# (benchmarks/train/train_shipped.sh): the target's own answers to 2656 ShareGPT and 1200 GSM8K prompts, 2000 GSM8K
# solutions and 3000 packed ShareGPT rows, 320 tokens, STEPS (3000) x 16 sequences x 32 anchors, lr 1e-3, bf16 where
# the CPU multiplies bf16 natively, else fp32 (BF16: shipped_data.sh's bf16_flag).
# It reads the parallel head's aux layers (2, 15, 28), so when that run's folder exists (HEAD_RUN) its data and
# feature cache are linked, not rebuilt: both heads learn from the very same features. HIDDEN=1 also trains a
# hidden-state draft on the same data and steps (benchmarks/train/train_hidden_shipped.sh: its own feature pass, as it reads
# the final-norm layer).
# Time on 2 cores: a step ~1.9 s on the AMX machine (bf16) and ~2.2 s on an AVX2 one (fp32,
# benchmarks/train/eagle3_train_step.py): 3000 steps ~1.6-1.8 h; the feature pass, when not linked, ~6.5 (AMX) or ~1.2
# (AVX2) sequences a second, ~1.1 MB each. Every stage resumes: rerun the same command after an interruption.
# Data-parallel: PROCS=N runs N processes on this machine; torchrun works too (docs/training.md).
# Environment: OUT (runs/eagle3/smollm2-head), HEAD_RUN (runs/shipped/smollm2-head), STEPS, LR (1e-3), INIT_HEAD (a
# warm start: a trained head of the same shape, e.g. the shipped one), BF16 (auto), THREADS, PROCS, HIDDEN,
# HIDDEN_OUT (runs/hidden_state/smollm2-shipped-data), SHAREGPT_ROWS and GSM8K_ROWS (a wider mix: shipped_data.sh;
# give it its own OUT and a HEAD_RUN without features, e.g. HEAD_RUN=none, so nothing narrower is linked). The wide
# run (SHAREGPT_ROWS=12000 GSM8K_ROWS=7000 OUT=runs/eagle3/smollm2-wide HEAD_RUN=none STEPS=6000) against the
# shipped drafters: SPECS_EXTRA="eagle3-wide=benchmarks/specs/eagle3-wide.json" bash benchmarks/bench/generalisation.sh.
set -euo pipefail
source "$(dirname "$0")/shipped_data.sh"
OUT=${OUT:-runs/eagle3/smollm2-head}
HEAD_RUN=${HEAD_RUN:-runs/shipped/smollm2-head}
[ -f "$D/smollm2-sharegpt.jsonl" ] || $F self-data --data sharegpt --num-prompts 2656 --max-new-tokens 192 \
  --threads "$T" --out $D/smollm2-sharegpt.jsonl
COMMON=(--target smollm2-135m --data "$SHIPPED_DATA" --eval-data $D/smollm2-mix-test.jsonl --seq-len 320 --anchors 32
        --topk-teacher 32 --feature-dtype bfloat16 --steps "${STEPS:-3000}" --warmup 100 --batch-size 16 $(bf16_flag "$OUT")
        --checkpoint-every 50 --eval-sequences 72 --threads "$T" --processes "${PROCS:-1}")

# A linked cache still being filled by the parallel-head run would get two writers: wait for it instead.
if [ -f "$HEAD_RUN/features/meta.json" ] && ! .venv/bin/python -c "import json, sys; m = json.load(open(sys.argv[1])); \
    sys.exit(m['done'] != m['num_sequences'])" "$HEAD_RUN/features/meta.json"; then
  echo "train_eagle3.sh: $HEAD_RUN/features is still being made by the parallel-head run; rerun when it is done" >&2
  exit 1
fi
mkdir -p "$OUT"
for part in data features; do
  if [ -e "$HEAD_RUN/$part" ] && [ ! -e "$OUT/$part" ]; then ln -s "$(realpath "$HEAD_RUN/$part")" "$OUT/$part"; fi
done
$F train eagle3 "${COMMON[@]}" --aux-layers 2,15,28 --draft-vocab 8192 --ttt-steps 3 --step-decay 0.8 --lr "${LR:-1e-3}" \
  ${INIT_HEAD:+--init-head "$INIT_HEAD"} --out "$OUT"

if [ "${HIDDEN:-0}" = 1 ]; then
  OUT="${HIDDEN_OUT:-runs/hidden_state/smollm2-shipped-data}" bash benchmarks/train/train_hidden_shipped.sh
fi

# The head in use: lossless, so the text equals plain greedy decoding; the statistics line shows tau.
$F generate "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" \
  --eagle "$OUT/head" --max-new-tokens 96 --threads "$T"
# The same head for vLLM and SGLang.
$F export eagle3 --head "$OUT/head" --target smollm2-135m --out "$OUT/engine"
