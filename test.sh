#!/usr/bin/env bash
# The test suite: set up if needed, then run every test but the slow ones (real Qwen models).
# Run the slow ones with: ./test.sh -m slow
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
if [ $# -eq 0 ]; then
  set -- -m "not slow"
fi
exec .venv/bin/python -m pytest "$@"
