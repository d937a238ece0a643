#!/usr/bin/env bash
# llama.cpp as a peer in `foretell bench` (method llama-cpp: llama-cpp-python on the model's own GGUF file).
# No binary wheel exists for this platform on the package index, so pip builds it from source: about 5 minutes on
# 2 free cores. GGML_NATIVE tunes it for this CPU, as a user building llama.cpp here would.
#   bash scripts/install_llama_cpp.sh      then: foretell bench --methods plain,llama-cpp ...
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if .venv/bin/python -c "import llama_cpp, llama_cpp.server" 2>/dev/null; then
  echo "llama-cpp-python is already installed" >&2
  exit 0
fi
echo "building llama-cpp-python 0.3.36 from source (a few minutes)" >&2
CMAKE_ARGS="-DGGML_NATIVE=ON" .venv/bin/python -m pip install -q "llama-cpp-python[server]==0.3.36"  # the server: the batching benchmark's peer
.venv/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
