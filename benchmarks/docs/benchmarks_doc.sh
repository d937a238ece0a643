#!/usr/bin/env bash
# Regenerates docs/benchmarks.md: `foretell bench` on SmolLM2-135M and on the Qwen2.5-Coder
# 0.5B/1.5B pair (Spec-Bench, bf16, greedy), plus the forward cost curves.
# The Qwen method list is what fits in about an hour on 2 CPU cores: the chain, the dynamic tree
# (default budget 24), a budget sweep and the hardware-aware tuner; transformers' assisted
# generation with the same pair is measured by benchmarks/bench/core_speed.py.
# Environment: PER_CATEGORY (default 4), MAX_NEW_TOKENS (default 128), SKIP_QWEN=1.
# An interrupted run resumes where it stopped (same runs/docs folders).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
PER=${PER_CATEGORY:-4}
TOK=${MAX_NEW_TOKENS:-128}
F=.venv/bin/foretell
mkdir -p docs/img runs/docs
COMMON=(--datasets spec-bench --per-category "$PER" --max-new-tokens "$TOK" --dtype bfloat16)

$F bench --model smollm2-135m "${COMMON[@]}" \
  --methods plain,prompt-lookup,hf-plain,hf-prompt-lookup --out runs/docs/smollm2
$F cost smollm2-135m --plot docs/img/cost_smollm2.png > runs/docs/cost_smollm2.txt
DIRS=(runs/docs/smollm2)
if [ "${SKIP_QWEN:-0}" != 1 ]; then
  $F bench --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b "${COMMON[@]}" \
    --methods plain,draft-chain,draft-tree,draft-tree@8,draft-tree@16,draft-tree-auto \
    --out runs/docs/qwen
  $F cost qwen2.5-coder-1.5b qwen2.5-coder-0.5b --plot docs/img/cost_qwen.png > runs/docs/cost_qwen.txt
  DIRS+=(runs/docs/qwen)
fi
.venv/bin/python benchmarks/docs/assemble_doc.py "${DIRS[@]}" > docs/benchmarks.md
echo "wrote docs/benchmarks.md" >&2
