#!/usr/bin/env bash
# Trains the hidden-state draft (seed 000) for SmolLM2-135M-Instruct on the target's own answers to GSM8K and
# ShareGPT prompts (benchmarks/train/self_data.sh), reports its held-out hidden MSE, per-depth acceptance and hot-vocabulary
# coverage (OUT/eval.json, OUT/eval.md), and decodes one prompt with it. On 2 CPU cores:
#   self data      2000 prompts answered by the target: shipped in benchmarks/data/self_data, unpacked (FRESH=1: ~35 min)
#   feature pass   2000 sequences x 320 tokens, bf16                                  ~10 min
#   training       400 steps x 8 sequences, 16 KL anchors each, bf16 (fp32 without native bf16: bf16_flag.sh);
#                  the unrolled steps grow 1 -> 5 over the first half (2.5-7 s a step)     ~30-45 min
#   evaluation     72 held-out sequences (GSM8K and ShareGPT test prompts), every anchor, depth 5   ~2 min
# Interrupt it at any time: rerunning continues from the last checkpoint (every 20 steps); the feature pass resumes too.
# Environment: OUT (default runs/hidden_state/smollm2-self), STEPS, THREADS, MSE_WEIGHT / KL_WEIGHT (the seed's 0.7 /
# 0.3), LR (1e-3), INIT_DRAFT (continue from a trained draft folder; then the curriculum is off: full depth from the
# first step). A variant with another OUT reuses the default run's data and cached features (linked).
# After the default run, a second stage continues from its draft: MORE_STEPS (default 800; 0 skips it) more steps at
# full depth with a fresh schedule (lr 6e-4) -> runs/hidden_state/smollm2-self-long (~40 min), the same as
#   OUT=runs/hidden_state/smollm2-self-long INIT_DRAFT=runs/hidden_state/smollm2-self/draft STEPS=800 LR=6e-4 bash benchmarks/train/train_hidden_state.sh
# and a third from that: LAST_STEPS (default 400; 0 skips it) at lr 4e-4 -> runs/hidden_state/smollm2-self-long2
# (~20 min), the draft the bench and doc scripts use:
#   OUT=runs/hidden_state/smollm2-self-long2 INIT_DRAFT=runs/hidden_state/smollm2-self-long/draft STEPS=400 LR=4e-4 bash benchmarks/train/train_hidden_state.sh
# That last stage installs its draft as `foretell generate`'s default drafter for smollm2-135m (--install; INSTALL=0
# skips it): with prompt lookup's branch and the adaptive budget it is ahead of prompt lookup alone overall
# (docs/hidden-state.md). `foretell generate --drafter prompt-lookup` still picks prompt lookup.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash benchmarks/train/self_data.sh
BASE=runs/hidden_state/smollm2-self
OUT=${OUT:-$BASE}
F=.venv/bin/foretell
D=runs/self_data
source benchmarks/train/bf16_flag.sh  # --bf16 only where this CPU multiplies bf16 natively
if [ "$OUT" != "$BASE" ]; then
  mkdir -p "$OUT"
  for part in data features; do
    if [ -e "$BASE/$part" ] && [ ! -e "$OUT/$part" ]; then ln -s "$(realpath "$BASE/$part")" "$OUT/$part"; fi
  done
fi

CURRICULUM=0.5
if [ -n "${INIT_DRAFT:-}" ]; then CURRICULUM=0; fi  # a trained draft already unrolls the full depth
INSTALL_FLAG=
if [ "$OUT" = "$BASE-long2" ] && [ "${INSTALL:-1}" != 0 ]; then INSTALL_FLAG=--install; fi
$F train hidden-state --target smollm2-135m --data $D/smollm2-mix.jsonl --eval-data $D/smollm2-mix-test.jsonl \
  --seq-len 320 --depth 5 --token-info-rank 256 --init-layer middle --mse-weight "${MSE_WEIGHT:-0.7}" --kl-weight "${KL_WEIGHT:-0.3}" --noise 0.1 \
  --curriculum "$CURRICULUM" ${INIT_DRAFT:+--init-draft "$INIT_DRAFT"} --logit-clamp 50 --anchors 16 --topk-teacher 32 --feature-dtype bfloat16 \
  --steps "${STEPS:-400}" --batch-size 8 --lr "${LR:-1e-3}" $(bf16_flag "$OUT") --checkpoint-every 20 --eval-sequences 48 \
  --threads "${THREADS:-2}" --out "$OUT" $INSTALL_FLAG

# The draft in use: lossless, so the text equals plain greedy decoding; the statistics line shows tau.
$F generate "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" \
  --hidden-draft "$OUT/draft" --max-new-tokens 96 --threads "${THREADS:-2}"

if [ "$OUT" = "$BASE" ] && [ -z "${INIT_DRAFT:-}" ] && [ "${MORE_STEPS:-800}" != 0 ]; then
  OUT=$BASE-long INIT_DRAFT=$BASE/draft STEPS=${MORE_STEPS:-800} LR=6e-4 bash "$0"
fi
if [ "$OUT" = "$BASE-long" ] && [ "${LAST_STEPS:-400}" != 0 ]; then
  OUT=$BASE-long2 INIT_DRAFT=$BASE-long/draft STEPS=${LAST_STEPS:-400} LR=4e-4 bash "$0"
fi
