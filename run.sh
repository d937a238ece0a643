#!/usr/bin/env bash
# The main job: set up if needed, then generate with foretell on the embedded default model
# (SmolLM2-135M-Instruct) and print the text and decoding statistics.
# It runs the fastest path foretell has measured on every CPU class: the GGUF file's own blocks with 8-bit
# activations, as llama.cpp computes (--quant gguf-q8 --dtype float32). `--quant none --dtype bfloat16` runs the
# exact weights instead (what each path changes: README.md, "Which path"). Arguments go to `foretell generate`,
# after these defaults, so they override them: e.g.
#   ./run.sh "Tell me a joke" --temperature 0.7      ./run.sh --max-new-tokens 64      ./run.sh --quant none
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
if [ $# -eq 0 ] || [[ "$1" == -* ]]; then
  # a prompt this small model answers sensibly at some length, so the drafter's work shows in the statistics
  set -- "List five tips for staying healthy, with one sentence each." "$@"
fi
prompt=$1
shift
exec .venv/bin/foretell generate "$prompt" --quant gguf-q8 --dtype float32 "$@"
