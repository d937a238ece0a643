#!/usr/bin/env bash
# Issue 20's broader data, end to end: the shipped EAGLE-3 head and parallel head, each warm-started from its shipped
# weights and trained STEPS (1000) more steps at LR (5e-4) on the wide mix (22778 sequences: the shipped 2656 + 1200
# target answers, 7000 GSM8K solutions, 12000 packed ShareGPT rows; benchmarks/train/train_eagle3.sh), both reading one
# feature cache; then one greedy and one sampled (T=0.7, seed 1) generalisation run putting them beside the shipped
# drafters, and the per-category gain tables (what the wider data bought, over the same drafter shipped).
# On 2 AVX2 cores: feature pass ~4.8 h (1.3 sequences a second, ~25 GB), EAGLE-3 ~35 min (2.1 s a step in fp32), the
# parallel head ~70 min (~4.2 s a step), each generalisation run ~19 min quiet. Every stage resumes: rerun the command.
# The heads are compared, not shipped: ship a winner with benchmarks/ship/ship_drafter.py (docs/training.md).
# Environment: STEPS, LR, OUT (runs/wide: the generalisation runs), THREADS.
set -euo pipefail
cd "$(dirname "$0")/../.."
export SHAREGPT_ROWS=12000 GSM8K_ROWS=7000 STEPS=${STEPS:-1000} LR=${LR:-5e-4}
EAGLE=runs/eagle3/smollm2-wide
HEAD=runs/shipped/smollm2-wide-head
OUT=${OUT:-runs/wide}
OUT=$EAGLE HEAD_RUN=none INIT_HEAD=src/foretell/shipped/smollm2-135m-eagle3 bash benchmarks/train/train_eagle3.sh
OUT=$HEAD FEATURES_FROM=$EAGLE INIT_HEAD=src/foretell/shipped/smollm2-135m-head bash benchmarks/train/train_shipped.sh
for temp in 0 0.7; do
  run=$OUT/generalisation$([ "$temp" = 0 ] || echo "-t$temp")
  TEMP=$temp SEED=1 OUT=$run COMPARE="head-wide=$HEAD/head" \
    SPECS_EXTRA="eagle3-wide=benchmarks/specs/eagle3-wide.json" bash benchmarks/bench/generalisation.sh
  .venv/bin/python benchmarks/docs/generalisation_doc.py "$run" --gain eagle3-wide=smollm2-135m-eagle3 \
    --gain head-wide=smollm2-135m-head > "$run/gain.md"
  echo "per-category gains: $run/gain.md"
done
