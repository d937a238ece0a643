#!/usr/bin/env bash
# The main job: set up if needed, then generate with foretell on the embedded default model
# (SmolLM2-135M-Instruct) and print the text and decoding statistics.
# Arguments go to `foretell generate`: a prompt and/or options, e.g.
#   ./run.sh "Tell me a joke" --temperature 0.7      ./run.sh --max-new-tokens 64
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
if [ $# -eq 0 ] || [[ "$1" == -* ]]; then
  # a word problem: the shipped drafter knows how this model explains arithmetic
  prompt="Tom has 12 apples. He buys 7 more and gives 5 to his sister. How many apples does Tom have now?"
  set -- "$prompt Explain step by step." "$@"
fi
exec .venv/bin/foretell generate "$@"
