#!/usr/bin/env bash
# AdaSPEC's select fraction k, swept on the self-data GSM8K run (benchmarks/adaspec/adaspec_self.sh with LAYERS=1 STEPS=300
# TAG=1layer-300, which it runs first if missing): one more AdaSPEC draft per k, each in OUT/draft-kK, all sharing
# that run's teacher cache and reference; then alpha of every draft on the held-out target answers, and where
# AdaSPEC gains or loses per token (benchmarks/adaspec/adaspec_tokens.py: by the target's top probability).
# ~21 min per k on 2 cores. Environment: FRACTIONS (default "0.6 0.8"; k = 0.4 is the run itself).
# -> runs/adaspec-sweep/gsm8k-1layer-300.json, gsm8k-1layer-300-tokens.json; docs/adaspec.md
set -euo pipefail
cd "$(dirname "$0")/../.."
F=.venv/bin/foretell
CACHE=$(.venv/bin/python -c "from foretell.paths import default_cache_dir; print(default_cache_dir())")
OUT="$CACHE/drafts/smollm2-adaspec-self-gsm8k-1layer-300"
S=runs/self_data
if [ ! -f "$OUT/draft/done.json" ]; then DATASETS=gsm8k LAYERS=1 STEPS=300 TAG=1layer-300 bash benchmarks/adaspec/adaspec_self.sh; fi
DRAFTS=(--draft "undistilled=$OUT/init/model" --draft "distill-all-tokens=$OUT/distill-all-tokens/model"
        --draft "adaspec-k0.4=$OUT/draft/model")
TOKENS=(--draft "all-tokens=$OUT/distill-all-tokens/model" --draft "k0.4=$OUT/draft/model")
for K in ${FRACTIONS:-0.6 0.8}; do
  $F train adaspec --stage draft --select-fraction "$K" --draft-name "draft-k$K" --target smollm2-135m \
    --data "$S/smollm2-gsm8k.jsonl" --draft-layers 1 --seq-len 256 --steps 300 --batch-size 16 --micro-batch-size 4 \
    --bf16 --teacher-dtype bfloat16 --eval-sequences 0 --threads 2 --out "$OUT"
  DRAFTS+=(--draft "adaspec-k$K=$OUT/draft-k$K/model")
  TOKENS+=(--draft "k$K=$OUT/draft-k$K/model")
done
mkdir -p runs/adaspec-sweep
$F eval-draft --target smollm2-135m --data "$S/smollm2-gsm8k-test.jsonl" --num-sequences 48 --prompts 0 \
  --temperature 1.0 --dtype bfloat16 "${DRAFTS[@]}" --json runs/adaspec-sweep/gsm8k-1layer-300.json
.venv/bin/python benchmarks/adaspec/adaspec_tokens.py --data "$S/smollm2-gsm8k-test.jsonl" "${TOKENS[@]}" \
  --json runs/adaspec-sweep/gsm8k-1layer-300-tokens.json
.venv/bin/python benchmarks/docs/adaspec_doc.py runs/adaspec > docs/adaspec.md
echo "wrote docs/adaspec.md" >&2
