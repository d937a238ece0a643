#!/usr/bin/env bash
# The main job: set up if needed, then generate with foretell on the embedded default model
# (SmolLM2-135M-Instruct) and print the text and decoding statistics.
# Arguments go to `foretell generate`: a prompt and/or options, e.g.
#   ./run.sh "Tell me a joke" --temperature 0.7      ./run.sh --max-new-tokens 64
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
if [ $# -eq 0 ] || [[ "$1" == -* ]]; then
  # a prompt this small model answers sensibly at some length, so the drafter's work shows in the statistics
  set -- "List five tips for staying healthy, with one sentence each." "$@"
fi
exec .venv/bin/foretell generate "$@"
