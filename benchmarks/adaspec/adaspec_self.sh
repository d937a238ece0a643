#!/usr/bin/env bash
# AdaSPEC trained on the target's own answers (benchmarks/train/self_data.sh), the closest this machine gets to the
# paper's regime, where the target is first fine-tuned on the task so that the training text is what the target
# itself would write. Per set (GSM8K: 1200 answers to train prompts; general: 800 answers to ShareGPT prompts):
# the 2-layer truncated-target draft (1) undistilled, (2) distilled on all tokens, (3) AdaSPEC; same data and
# steps as benchmarks/adaspec/adaspec_table.sh. alpha on the target's answers to held-out prompts (48 GSM8K test,
# 24 ShareGPT test) -> runs/adaspec-self/{gsm8k,sharegpt}.json and docs/adaspec.md. ~25 min per set on 2 cores
# (after the self data).
# Environment: DATASETS (default "gsm8k sharegpt"), STEPS (120), LAYERS (2), TAG (a suffix naming a variant: its
# drafts go to smollm2-adaspec-self-DATA-TAG and reuse the untagged run's tokenised data and teacher cache).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash benchmarks/train/self_data.sh
F=.venv/bin/foretell
CACHE=$(.venv/bin/python -c "from foretell.paths import default_cache_dir; print(default_cache_dir())")
S=runs/self_data
mkdir -p runs/adaspec-self
for DATA in ${DATASETS:-gsm8k sharegpt}; do
  BASE="$CACHE/drafts/smollm2-adaspec-self-$DATA"
  OUT="$BASE${TAG:+-$TAG}"
  mkdir -p "$OUT"
  if [ -n "${TAG:-}" ]; then  # the teacher pass does not depend on the draft: share it
    for part in data teacher; do
      if [ -e "$BASE/$part" ] && [ ! -e "$OUT/$part" ]; then ln -s "$BASE/$part" "$OUT/$part"; fi
    done
  fi
  $F train adaspec --target smollm2-135m --data "$S/smollm2-$DATA.jsonl" --draft-layers "${LAYERS:-2}" --seq-len 256 \
    --steps "${STEPS:-120}" --batch-size 16 --micro-batch-size 4 --bf16 --teacher-dtype bfloat16 --eval-sequences 0 \
    --threads 2 --out "$OUT"
  $F eval-draft --target smollm2-135m --data "$S/smollm2-$DATA-test.jsonl" --num-sequences 48 --prompts 0 \
    --temperature 1.0 --dtype bfloat16 --draft "undistilled=$OUT/init/model" \
    --draft "distill-all-tokens=$OUT/distill-all-tokens/model" --draft "adaspec=$OUT/draft/model" \
    --json "runs/adaspec-self/$DATA${TAG:+-$TAG}.json"
  echo "{\"layers\": ${LAYERS:-2}, \"steps\": ${STEPS:-120}}" > "runs/adaspec-self/$DATA${TAG:+-$TAG}.settings.json"
done
.venv/bin/python benchmarks/docs/adaspec_doc.py runs/adaspec > docs/adaspec.md
echo "wrote docs/adaspec.md" >&2
