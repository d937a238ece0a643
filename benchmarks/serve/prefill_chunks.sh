#!/usr/bin/env bash
# Prompt tokens a pass (--prefill-chunk) against throughput, time to first token and the waits between a request's
# tokens, in process (batch_profile.py, plain batching, gguf-q8), chunk sizes in turns, ROUNDS times.
#   OUT=benchmarks/results/prefill_chunk_avx2 bash benchmarks/serve/prefill_chunks.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/prefill_chunks}
CHUNKS=${CHUNKS:-"256 128 64"}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
export OMP_NUM_THREADS=2
for round in $(seq "$ROUNDS"); do
  for load in "4 24" "16 48"; do
    set -- $load
    for chunk in $CHUNKS; do
      line=$(.venv/bin/python benchmarks/serve/batch_profile.py none --budgets none --quant gguf-q8 --dtype float32 \
        --clients "$1" --requests "$2" --max-tokens 128 --per-category 2 --prefill-chunk "$chunk" 2>&1 | tail -1)
      echo "round $round, $1 clients, chunk $chunk: $line" | tee -a "$OUT/log.txt"
    done
  done
done
