#!/usr/bin/env bash
# Trains a parallel draft head (depth 4, one layer) for SmolLM2-135M-Instruct on GSM8K, then
# reports its per-depth acceptance on the GSM8K test split and decodes a few Spec-Bench prompts.
# Sized for about 30-45 minutes on 2 CPU cores (estimated from timing the same shapes with random
# weights: the bf16 feature pass ~0.3 s per 256-token sequence, a bf16 head step ~0.15 s per sequence):
#   feature pass   2000 sequences x 256 tokens       ~11 min, ~1.9 GB in OUT/features
#   training       600 steps x 16 sequences x 32 anchors (~5 epochs)   ~25 min
#   evaluation     64 held-out sequences, every anchor               ~1 min
# Interrupt it at any time: rerunning continues from the last checkpoint (every 50 steps).
# Environment: OUT (default runs/parallel_head/smollm2), SEQUENCES, STEPS, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${OUT:-runs/parallel_head/smollm2}
F=.venv/bin/foretell

$F train parallel-head --target smollm2-135m --data gsm8k --num-sequences "${SEQUENCES:-2000}" --seq-len 256 \
  --depth 4 --head-layers 1 --anchors 32 --depth-decay 0.8 --topk-teacher 32 --feature-dtype bfloat16 \
  --steps "${STEPS:-600}" --batch-size 16 --lr 1e-3 --bf16 --checkpoint-every 50 \
  --eval-sequences 64 --threads "${THREADS:-2}" --out "$OUT"

# The head in use: lossless, so the text equals plain greedy decoding; the statistics line shows tau.
$F generate "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" \
  --head "$OUT/head" --max-new-tokens 96 --threads "${THREADS:-2}"
