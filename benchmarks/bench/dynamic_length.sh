#!/usr/bin/env bash
# Issue 4, item 4: AdaSPEC's dynamic draft length (seed 001's recent-rejection-rate rule) against fixed
# draft lengths, transformers' +2/-1 rule and the hardware-aware choice, with the AdaSPEC-distilled
# SmolLM2 draft (built by benchmarks/adaspec/adaspec_table.sh) on GSM8K test prompts, bf16, greedy.
# Writes OUT/report.md (default runs/dynamic-length); rerunning resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
.venv/bin/foretell bench --model smollm2-135m --draft "${DRAFT:-smollm2-135m-adaspec-gsm8k}" --dtype bfloat16 \
  --datasets gsm8k --per-category "${PROMPTS:-12}" --max-new-tokens 128 --threads 2 \
  --methods plain,draft-chain,draft-chain-rejection,draft-chain-additive,draft-chain-auto \
  --gamma "${GAMMA:-4}" --out "${OUT:-runs/dynamic-length}"
for g in 2 6; do  # more fixed lengths, same prompts, their own folders
  .venv/bin/foretell bench --model smollm2-135m --draft "${DRAFT:-smollm2-135m-adaspec-gsm8k}" --dtype bfloat16 \
    --datasets gsm8k --per-category "${PROMPTS:-12}" --max-new-tokens 128 --threads 2 \
    --methods plain,draft-chain --gamma "$g" --out "${OUT:-runs/dynamic-length}-gamma$g"
done
.venv/bin/python benchmarks/docs/dynamic_length_doc.py "${OUT:-runs/dynamic-length}" > docs/dynamic-length.md
echo "wrote docs/dynamic-length.md" >&2
