#!/usr/bin/env bash
# AdaSPEC from a warm start (the paper's drafts begin as working language models, ours as a truncated target):
# the GSM8K comparison again, but every draft starts from the ShareGPT-distilled reference of
# benchmarks/adaspec/adaspec_table.sh (a general-chat draft), then (1) stays as it is, (2) is distilled on all GSM8K tokens,
# (3) is trained by AdaSPEC against that reference; same data, same 120 steps. Reports alpha on GSM8K test into
# runs/adaspec-warm/gsm8k-alpha.json (benchmarks/docs/adaspec_doc.py adds it to docs/adaspec.md). ~35 min on 2 cores
# (the GSM8K data and teacher cache are reused from the base run when present).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
F=.venv/bin/foretell
D=$(.venv/bin/python -c "from foretell.paths import default_cache_dir; print(default_cache_dir())")/drafts
INIT=$D/smollm2-adaspec-sharegpt/reference/model
[ -d "$INIT" ] || DATASETS=sharegpt bash benchmarks/adaspec/adaspec_table.sh
OUT=$D/smollm2-adaspec-gsm8k-warm
mkdir -p "$OUT" runs/adaspec-warm
for PART in data teacher; do  # same data and target: the base run's cache is valid here
  [ -d "$OUT/$PART" ] || [ ! -d "$D/smollm2-adaspec-gsm8k/$PART" ] || cp -r "$D/smollm2-adaspec-gsm8k/$PART" "$OUT/"
done
$F train adaspec --target smollm2-135m --data gsm8k --draft-init "$INIT" --num-sequences 1000 --seq-len 256 --steps 120 \
  --batch-size 16 --micro-batch-size 4 --bf16 --teacher-dtype bfloat16 --eval-sequences 0 --out "$OUT"
$F eval-draft --target smollm2-135m --data gsm8k --prompts-from data --num-sequences 64 --prompts 0 \
  --temperature 1.0 --dtype bfloat16 --draft "undistilled=$OUT/init/model" \
  --draft "distill-all-tokens=$OUT/distill-all-tokens/model" --draft "adaspec=$OUT/draft/model" \
  --json runs/adaspec-warm/gsm8k-alpha.json
.venv/bin/python benchmarks/docs/adaspec_doc.py runs/adaspec > docs/adaspec.md
