#!/usr/bin/env bash
# Is the SmolLM2 parallel head short of capacity? Heads of 1 and 2 decoder layers (LAYERS), each trained from scratch
# for STEPS (1500) steps over a DRAFT_VOCAB (8192) draft vocabulary (the hot vocabulary it drafts with; 2.7x cheaper
# steps: benchmarks/results/avx2-epyc/head-train-step) on the wide mix, reading the wide EAGLE-3 run's feature cache
# (runs/eagle3/smollm2-wide: benchmarks/train/wide_retrain.sh makes it, ~25 GB), then their held-out per-depth acceptance
# side by side with the wide head (benchmarks/train/head_capacity_table.py). On 2 AVX2 cores ~2 s a step for one layer.
# Every run resumes: rerun the command. Environment: LAYERS ("1 2"), STEPS, DRAFT_VOCAB, OUT (runs/capacity).
set -euo pipefail
cd "$(dirname "$0")/../.."
FEATURES=runs/eagle3/smollm2-wide
[ -d "$FEATURES/features" ] || { echo "head_capacity.sh: no feature cache in $FEATURES: run benchmarks/train/wide_retrain.sh" \
  "(its first stage makes it)" >&2; exit 1; }
OUT=${OUT:-runs/capacity}
runs=()
for layers in ${LAYERS:-1 2}; do
  run=$OUT/parallel-${layers}l-v${DRAFT_VOCAB:-8192}
  SHAREGPT_ROWS=12000 GSM8K_ROWS=7000 STEPS=${STEPS:-1500} HEAD_LAYERS=$layers DRAFT_VOCAB=${DRAFT_VOCAB:-8192} \
    OUT=$run FEATURES_FROM=$FEATURES bash benchmarks/train/train_shipped.sh
  runs+=("$run")
done
.venv/bin/python benchmarks/train/head_capacity_table.py runs/shipped/smollm2-wide-head "${runs[@]}" | tee "$OUT/table.md"
