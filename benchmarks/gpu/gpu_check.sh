#!/usr/bin/env bash
# The prepared GPU check (at most ~8 minutes on one H200), run through the device tool from the repository root:
#   bash benchmarks/gpu/gpu_check.sh            # writes $OUT (or runs/gpu_check) /gpu_check.{json,md}
#   DRY=1 bash benchmarks/gpu/gpu_check.sh      # the same code on CPU with tiny shapes (what the test suite runs)
#   FORETELL_GPU_CAPTURE=1 bash benchmarks/gpu/gpu_check.sh   # also CUDA-graph capture (opt-in until a run shows it works)
# Needs only the repository and the machine's PyTorch: random weights of real shapes, no model packages.
# Record the table in docs/gpu.md with its date.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT_DIR=${OUT:-runs/gpu_check}
PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} "$PY" benchmarks/gpu/gpu_check.py --out "$OUT_DIR" ${DRY:+--dry-run}
