#!/usr/bin/env bash
# The shipped-drafter recipe (benchmarks/train_shipped.sh) for the Qwen2.5-Coder-1.5B target: a parallel head on
# the target's own answers plus raw GSM8K and ShareGPT text, then one bench run putting it beside the 0.5B draft
# model (chain and tree) and prompt lookup. Not run on this 2-core CPU so far: a 1.5B forward costs about 11x
# SmolLM2-135M's here, so the stages below would take roughly
#   self data       1200 ShareGPT + 1200 GSM8K prompts answered by the 1.5B target          ~10 h
#   feature pass    ~7400 sequences x 320 tokens, bf16, top-32 teacher log-probs             ~11 h, ~15 GB
#   training        STEPS (3000) x 16 sequences x 32 anchors (the head is 1536 wide)          ~8 h
#   bench           GSM8K + Spec-Bench, 4 a category, 5 methods                               ~2 h
# (a GPU or a larger CPU brings this to minutes-hours). Every stage resumes: rerun the same command. The head is
# ~100 MB in bf16 (one 1536-wide layer with the target's 8960-wide MLP), over the 40 MB the package may hold, so
# it is not shipped: `foretell generate --model qwen2.5-coder-1.5b --head $OUT/head` loads it from the run.
# No evaluation prompt gets in: the data step drops every conversation sharing text with one (OUT/data/report.json).
# Environment: OUT (runs/shipped/qwen1.5b-head), STEPS, THREADS, PER (bench prompts a category).
set -euo pipefail
source "$(dirname "$0")/train_env.sh"
TARGET=qwen2.5-coder-1.5b
OUT=${OUT:-runs/shipped/qwen1.5b-head}
$F self-data --target $TARGET --data sharegpt --num-prompts 1200 --max-new-tokens 192 --batch-size 32 --threads "$T" \
  --out $D/qwen1.5b-sharegpt.jsonl
$F self-data --target $TARGET --data gsm8k --num-prompts 1200 --max-new-tokens 256 --batch-size 32 --threads "$T" \
  --out $D/qwen1.5b-gsm8k.jsonl
$F self-data --target $TARGET --data gsm8k --split test --num-prompts 48 --max-new-tokens 256 --batch-size 48 \
  --threads "$T" --out $D/qwen1.5b-gsm8k-test.jsonl
$F train parallel-head --target $TARGET \
  --data "$D/qwen1.5b-sharegpt.jsonl,$D/qwen1.5b-gsm8k.jsonl,gsm8k:2000,sharegpt:3000" \
  --eval-data $D/qwen1.5b-gsm8k-test.jsonl --seq-len 320 --depth 4 --head-layers 1 --anchors 32 --depth-decay 0.8 \
  --topk-teacher 32 --feature-dtype bfloat16 --steps "${STEPS:-3000}" --warmup 100 --batch-size 16 --lr 1e-3 $(bf16_flag "$OUT") \
  --checkpoint-every 50 --eval-sequences 48 --threads "$T" --out "$OUT"
$F bench --model $TARGET --draft qwen2.5-coder-0.5b --head "$OUT/head" --dtype bfloat16 \
  --datasets gsm8k,spec-bench --per-category "${PER:-4}" --max-new-tokens 128 --threads "$T" --resume \
  --methods plain,prompt-lookup,draft-chain,draft-tree-auto,parallel-head-auto-lookup --out "$OUT/bench"
echo "report: $OUT/bench/report.md"
