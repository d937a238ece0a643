#!/usr/bin/env bash
# The runtime's speed against its peers, as the runtime issue measures it (SmolLM2-135M, greedy, GSM8K +
# Spec-Bench, PER prompts a category, 128 new tokens, methods interleaved prompt by prompt in each run):
#   OUT/bf16   foretell plain (bf16) against transformers' plain generate
#   OUT/quant  on the GGUF file's own Q4_1 weights (--quant QUANT, default gguf) with float32 activations (QDTYPE;
#              where foretell's lean step runs them, runtime/lean_step.py): foretell plain, prompt lookup and
#              DRAFTER (a --spec-config file, default: the shipped default drafter's, if one ships) against
#              llama.cpp's plain decoding of the same file
#   OUT/split.md  where a plain token's time goes (benchmarks/bench/token_split.py): forward vs the loop around it
# Resumable (rerun the same command). Environment: OUT (runs/runtime_speed), PER (4), THREADS (2), QUANT (gguf),
# QDTYPE (float32), SPEC (a speculative configuration JSON for the quantized run), MODEL (smollm2-135m),
# PARTS (which of "bf16 quant split" to run; default all).
set -euo pipefail
cd "$(dirname "$0")/../.."
F=.venv/bin/foretell
OUT=${OUT:-runs/runtime_speed}
PER=${PER:-4}
T=${THREADS:-2}
QUANT=${QUANT:-gguf}
QDTYPE=${QDTYPE:-float32}
MODEL=${MODEL:-smollm2-135m}
PARTS=${PARTS:-bf16 quant split}
part() { [[ " $PARTS " == *" $1 "* ]]; }
COMMON=(--model "$MODEL" --datasets gsm8k,spec-bench --per-category "$PER" --max-new-tokens 128
        --threads "$T" --resume)

if part bf16; then $F bench "${COMMON[@]}" --dtype bfloat16 --methods plain,hf-plain --out "$OUT/bf16"; fi

# The quantized run's drafter: SPEC, else the target's default shipped drafter with its manifest's configuration.
if [ -z "${SPEC:-}" ]; then
  mkdir -p "$OUT"
  if .venv/bin/python -c "
import sys
from foretell.models.shipped import default_shipped
m = default_shipped(sys.argv[1])
sys.exit(1) if m is None else m.speculative_config().save(sys.argv[2])" "$MODEL" "$OUT/default-drafter.json"
  then SPEC=$OUT/default-drafter.json; fi
fi
EXTRA=()
if [ -n "${SPEC:-}" ]; then
  EXTRA=(--spec-config "drafter=$SPEC")
fi
if part quant; then
  $F bench "${COMMON[@]}" --dtype "$QDTYPE" --quant "$QUANT" --methods plain,prompt-lookup,llama-cpp "${EXTRA[@]}" \
    --out "$OUT/quant"
fi
if part split; then
  .venv/bin/python benchmarks/bench/token_split.py --model "$MODEL" --per 2 --threads "$T" "${EXTRA[@]}" > "$OUT/split.md"
  .venv/bin/python benchmarks/bench/token_split.py --model "$MODEL" --quant "$QUANT" --dtype "$QDTYPE" --per 2 --threads "$T" \
    "${EXTRA[@]}" > "$OUT/split-$QUANT.md"
fi
echo "reports (those run): $OUT/bf16/report.md $OUT/quant/report.md $OUT/split.md $OUT/split-$QUANT.md"
