#!/usr/bin/env bash
# The hidden-state drafter's speed ceiling (issue 5's 1.8x target): a fixed-budget sweep in one interleaved run
# (GSM8K test + Spec-Bench, PER prompts a category, bf16, greedy), then BENCH/ceiling.md and ceiling.png: per budget
# the measured speedup, the speedup with drafting for free on this CPU (tau * c(1) / c(1 + verified)) and on any
# hardware (tau). Run it on free cores (timings, and the cost curve measured on first use).
# Environment: HIDDEN (a trained draft folder), PER (default 4), BUDGETS, LOOKUP_BUDGETS, EXTRA (more methods),
# OUT (default runs/hidden-ceiling).
set -euo pipefail
cd "$(dirname "$0")/../.."
HIDDEN=${HIDDEN:-runs/hidden_state/smollm2-self-long2/draft}
OUT=${OUT:-runs/hidden-ceiling}
ONLY=plain,${EXTRA:-prompt-lookup,hidden-state-auto-lookup}  # references: the baseline and the best hidden-state method
for n in ${BUDGETS:-4 8 16 32 64}; do ONLY=$ONLY,hidden-state@$n; done
for n in ${LOOKUP_BUDGETS:-8 24 64}; do ONLY=$ONLY,hidden-state-lookup@$n; done
# The cost curve first (cached once per machine; the -auto method and the ceiling report read it).
.venv/bin/foretell cost smollm2-135m --dtype bfloat16 --threads 2 --plot "$OUT-cost.png"
# The same prompts and settings as benchmarks/bench/seed_drafters_bench.sh (the seed comparison), no draft model needed.
.venv/bin/foretell bench --model smollm2-135m --dtype bfloat16 --hidden-draft "$HIDDEN" --datasets gsm8k,spec-bench \
  --per-category "${PER:-4}" --max-new-tokens 128 --threads 2 --hot-vocab 8192 --methods "$ONLY" --out "$OUT"
.venv/bin/python benchmarks/bench/hidden_state_ceiling.py --bench "$OUT"
