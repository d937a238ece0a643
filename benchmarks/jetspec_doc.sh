#!/usr/bin/env bash
# docs/jetspec.md from the JetSpec (seed 003) runs: the trained head's held-out per-depth acceptance
# (benchmarks/train_parallel_head.sh), the GSM8K bench against plain decoding and prompt lookup, the
# LOSSY threshold table (benchmarks/lossy_table.sh) and the scheduler under load
# (benchmarks/scheduler_load.py). Missing runs are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
HEAD_RUN=${HEAD_RUN:-runs/parallel_head/smollm2}
BENCH=${BENCH:-runs/head-gsm8k-quick}
LOSSY=${LOSSY:-runs/lossy-quick}
LOAD=${LOAD:-runs/scheduler_load}
{
  echo "# JetSpec (seed 003) on SmolLM2-135M-Instruct"
  echo
  if [ -f "$HEAD_RUN/eval.md" ]; then
    echo "## The trained parallel head (\`bash benchmarks/train_parallel_head.sh\`), held-out GSM8K test"
    echo; sed 1d "$HEAD_RUN/eval.md"; echo
  fi
  if [ -f "$BENCH/report.md" ]; then
    echo "## GSM8K, bf16, greedy (\`DATASETS=gsm8k ONLY=plain,prompt-lookup,parallel-head,parallel-head-auto PER=10 OUT=$BENCH bash benchmarks/seed_drafters_bench.sh\`)"
    echo; sed -n '/^## overall/,/^Pass rate/p' "$BENCH/report.md" | sed '1d;$d'; echo
  fi
  if [ -f "$LOSSY/lossy.md" ]; then
    echo "## The opt-in LOSSY mode (\`HEAD=$HEAD_RUN/head PROMPTS=10 MAX_NEW=128 OUT=$LOSSY bash benchmarks/lossy_table.sh\`)"
    echo; sed 1d "$LOSSY/lossy.md"; echo
  fi
  if [ -f "$LOAD/scheduler_load.md" ]; then
    echo "## The adaptive scheduler under load (\`.venv/bin/python benchmarks/scheduler_load.py --head $HEAD_RUN/head --prompts 4\`)"
    echo; cat "$LOAD/scheduler_load.md"; echo
    [ -f "$LOAD/scheduler_load.png" ] && cp "$LOAD/scheduler_load.png" docs/jetspec-scheduler-load.png && echo "![budget per step](jetspec-scheduler-load.png)" && echo
  fi
} > docs/jetspec.md
echo "wrote docs/jetspec.md" >&2
