#!/usr/bin/env bash
# docs/seed-drafters.md (+ plots) from the one-run comparison of benchmarks/bench/seed_drafters_bench.sh
# (its GSM8K and overall columns through benchmarks/docs/report_table.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-runs/seed-drafters}
# How the run in docs was made (the hidden-state ablations left out while its draft is the short first one):
CMD=${CMD:-"ONLY=plain,prompt-lookup,draft-chain,draft-tree,parallel-head,parallel-head-lookup,parallel-head-auto-lookup,hidden-state HIDDEN=runs/hidden_state/smollm2/draft bash benchmarks/bench/seed_drafters_bench.sh"}
[ -f "$RUN/report.md" ] || { echo "no $RUN/report.md: run benchmarks/bench/seed_drafters_bench.sh first" >&2; exit 1; }
{
  echo "# The three research drafters side by side on SmolLM2-135M-Instruct"
  echo
  echo "Prompt lookup, a draft model (the 2-layer AdaSPEC draft \`smollm2-135m-adaspec-sharegpt\`, as a chain of 4 and"
  echo "as a dynamic tree), the JetSpec parallel head ([jetspec.md](jetspec.md)) and the hidden-state draft"
  echo "([hidden-state.md](hidden-state.md)) in one interleaved run: 4 GSM8K test prompts and 4 prompts in each of the 6"
  echo "Spec-Bench categories, 128 new tokens, bf16, greedy, 2 CPU cores. Speedups are against plain decoding of the same"
  echo "prompts in the same run; memory MB is one method's weights plus its KV caches. The drafters come from"
  echo "\`benchmarks/train/train_parallel_head.sh\`, \`benchmarks/adaspec/adaspec_table.sh\` and, for hidden-state, the short"
  echo "120-step recipe of \`benchmarks/train/train_hidden_state.sh\` (its 1600-step draft: [hidden-state.md](hidden-state.md))."
  echo "The run's record: [results.md](results.md#every-drafter-in-one-run)."
  echo
  echo "\`$CMD\`"
  echo
  echo "## overall"
  echo
  "$PY" benchmarks/docs/report_table.py "$RUN/report.md" --columns "method,speedup@gsm8k,tok/s,speedup,tau,drafts verified / pass,memory MB" \
    --notes "Dynamic tree vs chain"
  echo
  echo "![speedup](seed-drafters-speedup.png)"
  echo
  echo "![acceptance](seed-drafters-acceptance.png)"
  echo
  echo "## Conclusion"
  echo
  echo "The parallel head with the adaptive scheduler and prompt lookup's branch is the fastest drafter here, overall and"
  echo "on GSM8K. The truncated 2-layer draft model accepts too little: it barely pays as a chain and loses as a tree. The"
  echo "short-recipe hidden-state draft is slower than plain decoding."
} > docs/seed-drafters.md
cp "$RUN/speedup.png" docs/seed-drafters-speedup.png
cp "$RUN/acceptance.png" docs/seed-drafters-acceptance.png
echo "wrote docs/seed-drafters.md" >&2
