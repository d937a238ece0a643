#!/usr/bin/env bash
# Issue 6, item 4: what the opt-in LOSSY verification costs beside the speed it buys. One
# `foretell bench` run on GSM8K test prompts: plain decoding, the lossless parallel head, and the
# parallel head LOSSY at thresholds 0.85, 0.95, 0.99 (a draft whose path probability exceeds the
# threshold is accepted without the target's check). Greedy, so agreement with plain is defined.
# Writes $OUT/report.md (tok/s, speedup, tau, pass rate, wasted share) and $OUT/lossy.md
# (speedup, agreement with plain decoding, exact-match rate, GSM8K answer accuracy, unverified share).
# Rerunning with the same OUT resumes.
# Environment: HEAD (required: a parallel head folder from `foretell train parallel-head`),
# MODEL (smollm2-135m), DTYPE (bfloat16), PROMPTS (GSM8K problems, 40), MAX_NEW (256),
# THRESHOLDS ("0.85 0.95 0.99"), OUT (runs/lossy-table), FORETELL (.venv/bin/foretell).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HEAD:?set HEAD to a trained parallel head folder}"
METHODS=plain,parallel-head
for T in ${THRESHOLDS:-0.85 0.95 0.99}; do METHODS="$METHODS,parallel-head-lossy-$T"; done
OUT=${OUT:-runs/lossy-table}
"${FORETELL:-.venv/bin/foretell}" bench --model "${MODEL:-smollm2-135m}" --head "$HEAD" --dtype "${DTYPE:-bfloat16}" \
  --datasets gsm8k --per-category "${PROMPTS:-40}" --max-new-tokens "${MAX_NEW:-256}" --methods "$METHODS" --out "$OUT"
echo "lossy table: $OUT/lossy.md; full report: $OUT/report.md" >&2
