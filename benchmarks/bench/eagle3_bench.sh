#!/usr/bin/env bash
# The three trained drafters in one interleaved run on SmolLM2-135M-Instruct (bf16, greedy): the EAGLE-3 head,
# the parallel head and the hidden-state draft, trained on the same data with the same budget
# (benchmarks/train/train_eagle3.sh, benchmarks/train/train_shipped.sh), each with its fixed tree and with the adaptive
# scheduler, beside plain decoding and prompt lookup. GSM8K test and Spec-Bench, PER prompts per category (4).
# Every drafter drafts among 8192 tokens: the EAGLE-3 draft vocabulary, the others a hot vocabulary of that size.
# Writes OUT/report.md (tau, speedup, acceptance per position) and plots; rerunning resumes.
# Environment: EAGLE, HEAD, HIDDEN (the trained folders), PER, DATASETS, ONLY (a method list), OUT, THREADS.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
EAGLE=${EAGLE:-runs/eagle3/smollm2-head/head}
HEAD=${HEAD:-runs/shipped/smollm2-head/head}
HIDDEN=${HIDDEN:-runs/hidden_state/smollm2-shipped-data/draft}
METHODS=plain,prompt-lookup,eagle3,eagle3-auto,parallel-head,parallel-head-auto
[ -d "$HIDDEN" ] && METHODS=$METHODS,hidden-state,hidden-state-auto
.venv/bin/foretell bench --model smollm2-135m --dtype bfloat16 --eagle "$EAGLE" --head "$HEAD" \
  $([ -d "$HIDDEN" ] && echo --hidden-draft "$HIDDEN") \
  --datasets "${DATASETS:-gsm8k,spec-bench}" --per-category "${PER:-4}" --max-new-tokens 128 --threads "${THREADS:-2}" \
  --hot-vocab 8192 \
  --methods "${ONLY:-$METHODS}" --out "${OUT:-runs/eagle3-bench}"
