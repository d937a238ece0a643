# Sourced by the recipes that train on the shipped drafters' data (train_shipped.sh, train_eagle3.sh): makes the
# self data (benchmarks/train/self_data.sh) and sets F (the CLI), D (the self-data folder), T (threads) and
# SHIPPED_DATA, the training mix: the target's own answers to 2656 ShareGPT and 1200 GSM8K prompts, 2000 GSM8K
# solutions and 3000 packed ShareGPT rows (the 2656 answers are made by each recipe). Wider mixes (issue 20's
# "broader training data"): SHAREGPT_ROWS and GSM8K_ROWS (defaults 3000 and 2000, the shipped drafters' data).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash benchmarks/train/self_data.sh
source benchmarks/train/train_env.sh  # F (the CLI), D (the self-data folder), T (threads), bf16_flag
SHIPPED_DATA="$D/smollm2-sharegpt.jsonl,$D/smollm2-gsm8k.jsonl,gsm8k:${GSM8K_ROWS:-2000},sharegpt:${SHAREGPT_ROWS:-3000}"
