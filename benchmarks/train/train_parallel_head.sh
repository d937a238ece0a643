#!/usr/bin/env bash
# Trains a parallel draft head (depth 4, one layer) for SmolLM2-135M-Instruct on the target's own answers to
# GSM8K and ShareGPT prompts (benchmarks/train/self_data.sh), then reports its per-depth acceptance on held-out target
# answers to GSM8K test prompts and decodes one prompt with it. Times measured on 2 CPU cores:
#   self data      2000 prompts answered by the target: shipped in benchmarks/data/self_data, unpacked (FRESH=1: ~35 min)
#   feature pass   2000 sequences x 320 tokens, bf16                                  ~12 min, ~2.4 GB in OUT/features
#   training       600 steps x 16 sequences x 32 anchors                              ~26 min
#   evaluation     48 held-out sequences, every anchor                                ~1 min
#   continuation   1000 more steps from that head, lr 6e-4 (same features, linked) -> OUT-long   ~45 min
#   continuation   1000 more steps from OUT-long, lr 4e-4 -> OUT-long2/head, the benchmarks' head ~45 min
# Interrupt it at any time: rerunning continues from the last checkpoint (every 50 steps).
# Environment: OUT (default runs/parallel_head/smollm2-self), STEPS, MORE_STEPS, MORE_STEPS2, THREADS.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash benchmarks/train/self_data.sh
OUT=${OUT:-runs/parallel_head/smollm2-self}
F=.venv/bin/foretell
D=runs/self_data
source benchmarks/train/bf16_flag.sh  # --bf16 only where this CPU multiplies bf16 natively

$F train parallel-head --target smollm2-135m --data $D/smollm2-mix.jsonl --eval-data $D/smollm2-gsm8k-test.jsonl \
  --seq-len 320 --depth 4 --head-layers 1 --anchors 32 --depth-decay 0.8 --topk-teacher 32 --feature-dtype bfloat16 \
  --steps "${STEPS:-600}" --batch-size 16 --lr 1e-3 $(bf16_flag "$OUT") --checkpoint-every 50 --eval-sequences 48 \
  --threads "${THREADS:-2}" --out "$OUT"

# Two continuation stages from that head, each with a fresh, lower schedule on the same cached features
# (the held-out loss was still falling at the end of each stage).
PREV=$OUT
for stage in "long:${MORE_STEPS:-1000}:6e-4" "long2:${MORE_STEPS2:-1000}:4e-4"; do
  IFS=: read -r suffix steps lr <<<"$stage"
  NEXT=$OUT-$suffix
  mkdir -p "$NEXT"
  for part in data features; do [ -e "$NEXT/$part" ] || ln -s "$(realpath "$OUT/$part")" "$NEXT/$part"; done
  $F train parallel-head --target smollm2-135m --data $D/smollm2-mix.jsonl --eval-data $D/smollm2-gsm8k-test.jsonl \
    --seq-len 320 --depth 4 --head-layers 1 --anchors 32 --depth-decay 0.8 --topk-teacher 32 --feature-dtype bfloat16 \
    --init-head "$PREV/head" --steps "$steps" --warmup 30 --batch-size 16 --lr "$lr" $(bf16_flag "$NEXT") \
    --checkpoint-every 50 --eval-sequences 48 --threads "${THREADS:-2}" --out "$NEXT"
  PREV=$NEXT
done
OUT=$PREV

# The head in use: lossless, so the text equals plain greedy decoding; the statistics line shows tau.
$F generate "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" \
  --head "$OUT/head" --max-new-tokens 96 --threads "${THREADS:-2}"
