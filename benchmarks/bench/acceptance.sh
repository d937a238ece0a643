#!/usr/bin/env bash
# Issue 20's acceptance figures on this machine in one command: every drafter shipped for SmolLM2-135M-Instruct
# against prompt lookup and plain decoding over its acceptance set (GSM8K test + Spec-Bench, 4 prompts a category,
# bf16, 128 new tokens, 2 threads), greedy and at T=0.7 (seed 1), then the criteria against their targets
# (benchmarks/bench/acceptance_check.py). ~10 min a run on 2 AVX2 cores; rerunning resumes. OUT (runs/acceptance).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/acceptance}
DATASETS=spec-bench,gsm8k OUT=$OUT/greedy bash benchmarks/bench/generalisation.sh
DATASETS=spec-bench,gsm8k TEMP=0.7 SEED=1 OUT=$OUT/t0.7 bash benchmarks/bench/generalisation.sh
.venv/bin/python benchmarks/bench/acceptance_check.py "$OUT/greedy" "$OUT/t0.7" | tee "$OUT/acceptance.md"
