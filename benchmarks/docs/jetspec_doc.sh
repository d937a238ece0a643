#!/usr/bin/env bash
# docs/jetspec.md from the JetSpec parallel-head runs: the trained head's held-out per-depth acceptance
# (benchmarks/train/train_parallel_head.sh), the GSM8K bench against plain decoding and prompt lookup, the
# LOSSY threshold table (benchmarks/bench/lossy_table.sh) and the scheduler under load
# (benchmarks/bench/scheduler_load.py). Missing runs are left out.
set -euo pipefail
cd "$(dirname "$0")/../.."
HEAD_RUN=${HEAD_RUN:-runs/parallel_head/smollm2-self-long2}
LOSSY_HEAD=${LOSSY_HEAD:-runs/parallel_head/smollm2-self/head}  # the head lossy_table.sh ran with (before the continuation)
BENCH=${BENCH:-runs/seed-drafters}
LOSSY=${LOSSY:-runs/lossy-self}
LOAD=${LOAD:-runs/scheduler_load}
LOAD_HEAD=${LOAD_HEAD:-runs/parallel_head/smollm2/head}  # the head scheduler_load.py ran with (the first, GSM8K-text head)
{
  echo "# JetSpec parallel draft head on SmolLM2-135M-Instruct"
  echo
  if [ -f "$HEAD_RUN/eval.md" ]; then
    echo "## The trained parallel head"; echo; echo "\`bash benchmarks/train/train_parallel_head.sh\`; held-out target answers to GSM8K test prompts."
    echo; sed 1d "$HEAD_RUN/eval.md"; echo
  fi
  if [ -f "$BENCH/report.md" ]; then
    echo "## GSM8K and Spec-Bench, bf16, greedy: every drafter in one run (\`bash benchmarks/bench/seed_drafters_bench.sh\`, all of it in docs/seed-drafters.md)"
    echo; awk '/^## gsm8k/{on=1} /^## / && !/^## gsm8k/{on=0} on' "$BENCH/report.md" | sed 's/^## gsm8k/### GSM8K test/'
    awk '/^## overall/{on=1} /^Pass rate/{on=0} on' "$BENCH/report.md" | sed 's/^## overall/### overall (GSM8K + Spec-Bench)/'; echo
  fi
  if [ -f "$LOSSY/lossy.md" ]; then
    echo "## The opt-in LOSSY mode (\`HEAD=$LOSSY_HEAD PROMPTS=10 MAX_NEW=256 OUT=$LOSSY bash benchmarks/bench/lossy_table.sh\`)"
    echo; sed 1d "$LOSSY/lossy.md"; echo
  fi
  if [ -f "$LOAD/scheduler_load.md" ]; then
    echo "## The adaptive scheduler under load (\`.venv/bin/python benchmarks/bench/scheduler_load.py --head $LOAD_HEAD --prompts 4\`)"
    echo; cat "$LOAD/scheduler_load.md"; echo
    [ -f "$LOAD/scheduler_load.png" ] && cp "$LOAD/scheduler_load.png" docs/jetspec-scheduler-load.png && echo "![budget per step](jetspec-scheduler-load.png)" && echo
  fi
} > docs/jetspec.md
echo "wrote docs/jetspec.md" >&2
