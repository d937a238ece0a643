#!/usr/bin/env bash
# The target's own answers (SmolLM2-135M-Instruct, greedy, bf16) to GSM8K and ShareGPT training prompts, the
# drafters' training data: a drafter is judged on what the target writes, and a 135M model rarely writes the data
# sets' reference answers. foretell's engine writes them (continuous batching, the default drafter: 0.55 answers/s
# on ShareGPT in benchmarks/train/self_data_check.py, about an hour for the 2000 training prompts).
#   runs/self_data/smollm2-mix.jsonl        1200 GSM8K train (<= 256 new tokens) + 800 ShareGPT train (<= 192)
#   runs/self_data/smollm2-gsm8k-test.jsonl  48 GSM8K test prompts (held-out evaluation)
#   runs/self_data/smollm2-mix-test.jsonl    those + 24 ShareGPT held-out prompts
# Rerunning continues unfinished files and skips finished ones. Environment: THREADS, FRESH.
set -euo pipefail
source "$(dirname "$0")/train_env.sh"
# The answers this script made (on 2 cores, bf16) ship with the repository, gzipped: a fresh clone unpacks them and
# skips the ~35 min of decoding. Delete runs/self_data and set FRESH=1 to decode them again.
mkdir -p $D
if [ -z "${FRESH:-}" ]; then
  for f in benchmarks/data/self_data/*.jsonl.gz; do
    out=$D/$(basename "${f%.gz}")
    if [ -e "$f" ] && [ ! -e "$out" ]; then gunzip -c "$f" > "$out"; fi
  done
fi
$F self-data --data gsm8k --num-prompts 1200 --max-new-tokens 256 --threads "$T" --out $D/smollm2-gsm8k.jsonl
$F self-data --data sharegpt --num-prompts 800 --max-new-tokens 192 --threads "$T" --out $D/smollm2-sharegpt.jsonl
$F self-data --data gsm8k --split test --num-prompts 48 --max-new-tokens 256 --threads "$T" --out $D/smollm2-gsm8k-test.jsonl
$F self-data --data sharegpt --split test --num-prompts 24 --max-new-tokens 192 --threads "$T" --out $D/smollm2-sharegpt-test.jsonl
# The mix the earlier recipes train on: the first 1200 + 800 answers (benchmarks/train/train_shipped.sh answers more).
{ head -n 1200 $D/smollm2-gsm8k.jsonl; head -n 800 $D/smollm2-sharegpt.jsonl; } > $D/smollm2-mix.jsonl
cat $D/smollm2-gsm8k-test.jsonl $D/smollm2-sharegpt-test.jsonl > $D/smollm2-mix-test.jsonl
