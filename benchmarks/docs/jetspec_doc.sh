#!/usr/bin/env bash
# docs/jetspec.md from the JetSpec parallel-head runs: the trained head's held-out per-depth acceptance
# (benchmarks/train/train_parallel_head.sh), its rows of the every-drafter run (benchmarks/docs/report_table.py), the
# LOSSY threshold table (benchmarks/bench/lossy_table.sh) and the scheduler under load
# (benchmarks/bench/scheduler_load.py). Missing runs are left out.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
HEAD_RUN=${HEAD_RUN:-runs/parallel_head/smollm2-self-long2}
LOSSY_HEAD=${LOSSY_HEAD:-runs/parallel_head/smollm2-self/head}  # the head lossy_table.sh ran with (its 600-step stage)
BENCH=${BENCH:-runs/seed-drafters}
LOSSY=${LOSSY:-runs/lossy-self}
LOAD=${LOAD:-runs/scheduler_load}
LOAD_HEAD=${LOAD_HEAD:-runs/parallel_head/smollm2/head}  # the head scheduler_load.py ran with (trained on GSM8K text)
{
  echo "# JetSpec parallel draft head on SmolLM2-135M-Instruct"
  echo
  echo "A light transformer reads the target's hidden states fused from low, middle and high layers and drafts 4 tokens"
  echo "in one forward; the target verifies them as a tree. Methods: \`parallel-head\` (a fixed 16-node tree), \`-lookup\`"
  echo "(prompt lookup's match as one more branch), \`-auto\` (the adaptive scheduler: the hardware-aware budget, re-chosen"
  echo "as the machine's speed changes). Training and use: [training.md](training.md#parallel-draft-head-jetspec);"
  echo "\`foretell generate \"...\" --head DIR\`. All runs: bf16, greedy, 2 CPU cores."
  echo
  if [ -f "$HEAD_RUN/eval.md" ]; then
    echo "## The trained parallel head"; echo; echo "\`bash benchmarks/train/train_parallel_head.sh\`; held-out target answers to GSM8K test prompts."
    echo; sed 1d "$HEAD_RUN/eval.md" | sed '/./,$!d'; echo
  fi
  if [ -f "$BENCH/report.md" ]; then
    echo "## Decoding: GSM8K and Spec-Bench"
    echo
    echo "From the run of every drafter ([seed-drafters.md](seed-drafters.md#overall), 28 prompts, 128 new tokens):"
    echo; "$PY" benchmarks/docs/report_table.py "$BENCH/report.md" --columns "method,speedup@gsm8k,speedup,tau,drafts verified / pass" \
      --methods prompt-lookup,parallel-head,parallel-head-lookup,parallel-head-auto-lookup; echo
  fi
  if [ -f "$LOSSY/lossy.md" ]; then
    echo "## The opt-in LOSSY mode"
    echo; echo "\`HEAD=$LOSSY_HEAD PROMPTS=10 MAX_NEW=256 OUT=$LOSSY bash benchmarks/bench/lossy_table.sh\`"
    echo; sed 1d "$LOSSY/lossy.md" | sed '/./,$!d'; echo
  fi
  if [ -f "$LOAD/scheduler_load.md" ]; then
    echo "## The adaptive scheduler under load"
    echo; echo "\`.venv/bin/python benchmarks/bench/scheduler_load.py --head $LOAD_HEAD --prompts 4\`: the budget it picks while"
    echo "the cores are idle, loaded by another process, then idle again."
    echo; cat "$LOAD/scheduler_load.md"; echo
    [ -f "$LOAD/scheduler_load.png" ] && cp "$LOAD/scheduler_load.png" docs/jetspec-scheduler-load.png && echo "![budget per step](jetspec-scheduler-load.png)" && echo
  fi
  echo "## Conclusion"
  echo
  echo "The head alone pays most on GSM8K, most of its training data; with the lookup branch and the adaptive scheduler"
  echo "it is the fastest drafter in the comparison. LOSSY mode buys little: a lower threshold leaves some of the"
  echo "target's tokens unverified for a speedup close to the lossless head's. Under load the scheduler about doubles"
  echo "its budget, and returns to the idle one after."
} > docs/jetspec.md
echo "wrote docs/jetspec.md" >&2
