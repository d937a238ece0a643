#!/usr/bin/env bash
# docs/hidden-state.md from the hidden-state (seed 000) runs: the trained draft's held-out evaluation
# (benchmarks/train_hidden_state.sh: per-depth acceptance, hidden MSE, hot-vocabulary coverage) and a
# GSM8K bench against plain decoding. Missing runs are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/hidden_state/smollm2}
BENCH=${BENCH:-runs/hidden-gsm8k-quick}
{
  echo "# Hidden-state speculative decoding (seed 000) on SmolLM2-135M-Instruct"
  echo
  if [ -f "$RUN/eval.md" ]; then
    echo "## The trained draft (\`bash benchmarks/train_hidden_state.sh\`; settings in $RUN/train), held-out data"
    echo; sed 1d "$RUN/eval.md"; echo
  fi
  if [ -f "$BENCH/report.md" ]; then
    echo "## GSM8K, bf16, greedy (\`DATASETS=gsm8k ONLY=plain,hidden-state PER=10 OUT=$BENCH bash benchmarks/seed_drafters_bench.sh\`)"
    echo; sed -n '/^## overall/,/^Pass rate/p' "$BENCH/report.md" | sed '1d;$d'; echo
  fi
} > docs/hidden-state.md
echo "wrote docs/hidden-state.md" >&2
