#!/usr/bin/env bash
# The hidden-state draft (seed 000) for SmolLM2-135M-Instruct on the shipped drafters' data and budget
# (benchmarks/train/shipped_data.sh; STEPS (3000) x 16 sequences x 32 anchors, 320 tokens), so that it sits in one table
# with the EAGLE-3 head and the parallel head (benchmarks/bench/eagle3_bench.sh). train_eagle3.sh HIDDEN=1 runs it too.
# Like the EAGLE-3 head, it scores only its own 8192 tokens (the most drafted in the data; --draft-vocab 8192: the
# bench drafts among 8192 tokens with every drafter) and unrolls steps past the first only from the KL anchors
# (--deep-rows anchors): a depth-5 sequence 0.29 s in fp32 on 2 AVX2 cores, against 1.07 s for the seed's whole
# vocabulary and every row (benchmarks/train/hidden_train_step.py). Training runs in bf16 (--bf16, as the other two were) where this CPU multiplies bf16
# natively, else in fp32 (BF16=0/1 forces it; shipped_data.sh's bf16_flag): emulated bf16 makes every step several
# times slower.
# Time on a 2-core AVX2 CPU: the feature pass ~1.1 s a sequence (8778 sequences: ~2.7 h), then ~3.5 h of steps.
# Every stage resumes: rerun the same command (same BF16) after an interruption.
# Environment: OUT (runs/hidden_state/smollm2-shipped-data), STEPS, THREADS, PROCS, BF16 (auto).
set -euo pipefail
source "$(dirname "$0")/shipped_data.sh"
OUT=${OUT:-runs/hidden_state/smollm2-shipped-data}
$F train hidden-state --target smollm2-135m --data "$SHIPPED_DATA" --eval-data $D/smollm2-mix-test.jsonl --seq-len 320 \
  --anchors 32 --deep-rows anchors --topk-teacher 32 --feature-dtype bfloat16 --steps "${STEPS:-3000}" --warmup 100 \
  --batch-size 16 $(bf16_flag "$OUT") --checkpoint-every 50 --eval-sequences 72 --threads "$T" \
  --processes "${PROCS:-1}" --depth 5 --draft-vocab 8192 --lr 5e-4 --out "$OUT"
