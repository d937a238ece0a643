#!/usr/bin/env bash
# The seed systems side by side on SmolLM2-135M-Instruct (bf16, greedy), one interleaved run:
# GSM8K test and Spec-Bench, PER prompts per category (default 4).
#   issue 5 (seed 000): standard and tree speculative decoding with the AdaSPEC-distilled draft,
#                       the hidden-state drafter and its ablations (token-info, resampling, fusion, hot vocab)
#   issue 6 (seed 003): the parallel head (fixed tree, adaptive scheduler, and each with prompt lookup's match
#                       as one more branch of its tree) against the hidden-state drafter, the dynamic draft-model tree and
#                       prompt lookup
# Needs the trained drafts: benchmarks/adaspec/adaspec_table.sh, train_parallel_head.sh, train_hidden_state.sh.
# Writes OUT/report.md and plots (default runs/seed-drafters); rerunning resumes. Environment: DRAFT, HEAD,
# HIDDEN, PER, DATASETS, ONLY (a method list), OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
HEAD=${HEAD:-runs/parallel_head/smollm2-self-long2/head}
HIDDEN=${HIDDEN:-runs/hidden_state/smollm2-self-long2/draft}
METHODS=plain,prompt-lookup,draft-chain,draft-tree,parallel-head,parallel-head-lookup,parallel-head-auto,parallel-head-auto-lookup
[ -d "$HIDDEN" ] && METHODS=$METHODS,hidden-state,hidden-state-auto,hidden-state-no-info,hidden-state-no-resample,hidden-state-no-fusion,hidden-state-full-vocab
.venv/bin/foretell bench --model smollm2-135m --dtype bfloat16 --draft "${DRAFT:-smollm2-135m-adaspec-sharegpt}" \
  --head "$HEAD" $([ -d "$HIDDEN" ] && echo --hidden-draft "$HIDDEN") \
  --datasets "${DATASETS:-gsm8k,spec-bench}" --per-category "${PER:-4}" --max-new-tokens 128 --threads 2 --hot-vocab 8192 \
  --methods "${ONLY:-$METHODS}" --out "${OUT:-runs/seed-drafters}"
