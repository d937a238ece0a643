#!/usr/bin/env bash
# Trains a parallel draft head (depth 4, one layer) for SmolLM2-135M-Instruct on the target's own answers to
# GSM8K and ShareGPT prompts (benchmarks/self_data.sh), then reports its per-depth acceptance on held-out target
# answers to GSM8K test prompts and decodes one prompt with it. Times measured on 2 CPU cores:
#   self data      2000 prompts answered by the target (batched)                      ~35 min (skipped once made)
#   feature pass   2000 sequences x 320 tokens, bf16                                  ~12 min, ~2.4 GB in OUT/features
#   training       600 steps x 16 sequences x 32 anchors                              ~26 min
#   evaluation     48 held-out sequences, every anchor                                ~1 min
#   continuation   1000 more steps from that head, fresh schedule (its loss was still falling;
#                  same features, linked)  -> OUT-long/head, the head the benchmarks use  ~45 min
# Interrupt it at any time: rerunning continues from the last checkpoint (every 50 steps).
# Environment: OUT (default runs/parallel_head/smollm2-self), STEPS, MORE_STEPS, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
bash benchmarks/self_data.sh
OUT=${OUT:-runs/parallel_head/smollm2-self}
F=.venv/bin/foretell
D=runs/self_data

$F train parallel-head --target smollm2-135m --data $D/smollm2-mix.jsonl --eval-data $D/smollm2-gsm8k-test.jsonl \
  --seq-len 320 --depth 4 --head-layers 1 --anchors 32 --depth-decay 0.8 --topk-teacher 32 --feature-dtype bfloat16 \
  --steps "${STEPS:-600}" --batch-size 16 --lr 1e-3 --bf16 --checkpoint-every 50 --eval-sequences 48 \
  --threads "${THREADS:-2}" --out "$OUT"

# Continue training from that head with a fresh (lower) schedule, on the same cached features.
LONG=$OUT-long
mkdir -p "$LONG"
for part in data features; do [ -e "$LONG/$part" ] || ln -s "$(realpath "$OUT/$part")" "$LONG/$part"; done
$F train parallel-head --target smollm2-135m --data $D/smollm2-mix.jsonl --eval-data $D/smollm2-gsm8k-test.jsonl \
  --seq-len 320 --depth 4 --head-layers 1 --anchors 32 --depth-decay 0.8 --topk-teacher 32 --feature-dtype bfloat16 \
  --init-head "$OUT/head" --steps "${MORE_STEPS:-1000}" --warmup 30 --batch-size 16 --lr 6e-4 --bf16 \
  --checkpoint-every 50 --eval-sequences 48 --threads "${THREADS:-2}" --out "$LONG"
OUT=$LONG

# The head in use: lossless, so the text equals plain greedy decoding; the statistics line shows tau.
$F generate "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" \
  --head "$OUT/head" --max-new-tokens 96 --threads "${THREADS:-2}"
