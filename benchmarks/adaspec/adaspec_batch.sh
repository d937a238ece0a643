#!/usr/bin/env bash
# The authors' batch protocol on the self-data GSM8K run (benchmarks/adaspec/adaspec_self.sh with LAYERS=1 STEPS=150
# TAG=1layer-150, which it runs first if missing). Their released configs give the AdaSPEC stage 1/k times the
# reference's batch at the same number of steps (2 -> 5 sequences at k = 0.4), so a selective step trains on as
# many tokens as a plain step. Here: AdaSPEC with 40 = 16 / 0.4 sequences a step, and, as the control for the
# extra data, plain distillation on all tokens with the same 40 sequences a step; 150 steps each, same reference.
# Then AdaSPEC with 40 sequences a step on the main table's GSM8K run (benchmarks/adaspec/adaspec_table.sh: 2-layer draft,
# 120 steps, GSM8K text), alpha on GSM8K test. ~25 min per stage on 2 cores.
# -> runs/adaspec-batch/gsm8k-1layer-150.json, gsm8k-2layer-120.json; docs/adaspec.md
set -euo pipefail
cd "$(dirname "$0")/../.."
F=.venv/bin/foretell
CACHE=$(.venv/bin/python -c "from foretell.paths import default_cache_dir; print(default_cache_dir())")
OUT="$CACHE/drafts/smollm2-adaspec-self-gsm8k-1layer-150"
WIDE="$OUT-b40"  # the all-token control: its own run folder, sharing data, teacher and init
S=runs/self_data
if [ ! -f "$OUT/draft/done.json" ]; then DATASETS=gsm8k LAYERS=1 STEPS=150 TAG=1layer-150 bash benchmarks/adaspec/adaspec_self.sh; fi
COMMON=(--target smollm2-135m --data "$S/smollm2-gsm8k.jsonl" --draft-layers 1 --seq-len 256 --steps 150
        --micro-batch-size 4 --bf16 --teacher-dtype bfloat16 --eval-sequences 0 --threads 2)
$F train adaspec --stage draft --draft-name draft-b40 --batch-size 16 --adaspec-batch-size 40 "${COMMON[@]}" --out "$OUT"
mkdir -p "$WIDE"
for PART in data teacher init; do [ -e "$WIDE/$PART" ] || ln -s "$OUT/$PART" "$WIDE/$PART"; done
$F train adaspec --stage distill-all-tokens --batch-size 40 "${COMMON[@]}" --out "$WIDE"
mkdir -p runs/adaspec-batch
$F eval-draft --target smollm2-135m --data "$S/smollm2-gsm8k-test.jsonl" --num-sequences 48 --prompts 0 \
  --temperature 1.0 --dtype bfloat16 --draft "distill-all-tokens=$OUT/distill-all-tokens/model" \
  --draft "adaspec=$OUT/draft/model" --draft "distill-all-tokens-b40=$WIDE/distill-all-tokens/model" \
  --draft "adaspec-b40=$OUT/draft-b40/model" --json runs/adaspec-batch/gsm8k-1layer-150.json
TABLE="$CACHE/drafts/smollm2-adaspec-gsm8k"
if [ ! -f "$TABLE/draft/done.json" ]; then DATASETS=gsm8k bash benchmarks/adaspec/adaspec_table.sh; fi
$F train adaspec --target smollm2-135m --data gsm8k --draft-layers 2 --num-sequences 1000 --seq-len 256 --steps 120 \
  --batch-size 16 --micro-batch-size 4 --bf16 --teacher-dtype bfloat16 --eval-sequences 0 \
  --stage draft --draft-name draft-b40 --adaspec-batch-size 40 --out "$TABLE"
$F eval-draft --target smollm2-135m --data gsm8k --num-sequences 64 --prompts 0 --temperature 1.0 --dtype bfloat16 \
  --draft "distill-all-tokens=$TABLE/distill-all-tokens/model" --draft "adaspec=$TABLE/draft/model" \
  --draft "adaspec-b40=$TABLE/draft-b40/model" --json runs/adaspec-batch/gsm8k-2layer-120.json
.venv/bin/python benchmarks/docs/adaspec_doc.py runs/adaspec > docs/adaspec.md
echo "wrote docs/adaspec.md" >&2
