#!/usr/bin/env bash
# docs/seed-drafters.md (+ plots) from the one-run comparison of benchmarks/bench/seed_drafters_bench.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/seed-drafters}
# How the run in docs was made (the hidden-state ablations left out while its draft is the short first one):
CMD=${CMD:-"ONLY=plain,prompt-lookup,draft-chain,draft-tree,parallel-head,parallel-head-lookup,parallel-head-auto-lookup,hidden-state HIDDEN=runs/hidden_state/smollm2/draft bash benchmarks/bench/seed_drafters_bench.sh"}
[ -f "$RUN/report.md" ] || { echo "no $RUN/report.md: run benchmarks/bench/seed_drafters_bench.sh first" >&2; exit 1; }
{
  echo "# The seed systems side by side on SmolLM2-135M-Instruct"
  echo
  echo "Produced by \`$CMD\` (one interleaved run, bf16, greedy, 2 CPU cores); drafters"
  echo "from \`benchmarks/train/train_parallel_head.sh\`, \`benchmarks/adaspec/adaspec_table.sh\` and, for hidden-state, the first short version of"
  echo "\`benchmarks/train/train_hidden_state.sh\` (\`STEPS=120\`)."
  echo "Speedups are against plain decoding of the same prompts in the same run. bf16 'greedy = plain' counts differ"
  echo "because a multi-token pass rounds differently from a one-token pass; in fp32 every drafter is exact (tests)."
  echo
  sed '1,2d' "$RUN/report.md" | sed 's/(speedup.png)/(seed-drafters-speedup.png)/; s/(acceptance.png)/(seed-drafters-acceptance.png)/'
} > docs/seed-drafters.md
cp "$RUN/speedup.png" docs/seed-drafters-speedup.png
cp "$RUN/acceptance.png" docs/seed-drafters-acceptance.png
echo "wrote docs/seed-drafters.md" >&2
