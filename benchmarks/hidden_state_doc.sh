#!/usr/bin/env bash
# docs/hidden-state.md from the hidden-state (seed 000) runs: the trained draft's held-out evaluation
# (benchmarks/train_hidden_state.sh: per-depth acceptance, hidden MSE, hot-vocabulary coverage) and a
# GSM8K bench against plain decoding. Missing runs are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/hidden_state/smollm2}
BENCH=${BENCH:-runs/hidden-gsm8k-quick}
CHECK=${CHECK:-runs/hidden_checklist.md}
# The draft measured so far came from the first, short recipe on data-set text; the script now trains longer on
# the target's own answers (set RUN=runs/hidden_state/smollm2-self and RECIPE once that has run).
RECIPE=${RECIPE:-"\`STEPS=120 bash benchmarks/train_hidden_state.sh\` as of commit 77d26a2: 1000 GSM8K + ShareGPT data-set sequences"}
{
  echo "# Hidden-state speculative decoding (seed 000) on SmolLM2-135M-Instruct"
  echo
  if [ -f "$RUN/eval.md" ]; then
    echo "## The trained draft ($RECIPE; settings in $RUN/train), held-out data"
    echo; sed 1d "$RUN/eval.md"; echo
  fi
  if [ -f "$BENCH/report.md" ]; then
    echo "## GSM8K, bf16, greedy (\`DATASETS=gsm8k ONLY=plain,hidden-state PER=10 OUT=$BENCH bash benchmarks/seed_drafters_bench.sh\`)"
    echo; sed -n '/^## overall/,/^Pass rate/p' "$BENCH/report.md" | sed '1d;$d'; echo
  fi
  if [ -f "$CHECK" ]; then
    echo "## Seed 000's checklist (\`.venv/bin/python benchmarks/hidden_state_checklist.py --hidden-draft $RUN/draft --prompts 4 > $CHECK\`)"
    echo; echo "The held-out hidden MSE is in the first table above."; echo
    sed 's/^## /### /' "$CHECK"; echo
  fi
  echo "Every drafter side by side, this draft included: docs/seed-drafters.md (\`bash benchmarks/seed_drafters_bench.sh\`)."
} > docs/hidden-state.md
echo "wrote docs/hidden-state.md" >&2
