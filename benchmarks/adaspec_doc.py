"""docs/adaspec.md from the eval-draft JSON files that benchmarks/adaspec_table.sh writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from foretell.train.evaluate import format_table

SETS = {
    "gsm8k": "GSM8K (train: GSM8K train; alpha: GSM8K test; decoded: 12 GSM8K test prompts)",
    "sharegpt": "General (train: ShareGPT; alpha: ShareGPT test; decoded: 12 Spec-Bench prompts, 2 per category)",
}


def main(run_dir: str) -> None:
    print("# AdaSPEC on SmolLM2-135M-Instruct\n")
    print("Produced by `bash benchmarks/adaspec_table.sh`. Draft: 2 decoder layers taken from the target "
          "(embedding, first layers, final norm, output layer), 120 steps of 16 x 256 tokens per stage, bf16 "
          "autocast. alpha = mean over held-out assistant tokens of sum_v min(p, q) at temperature 1; "
          "acceptance, tau and speedup come from real speculative decoding (gamma 4, temperature 1, bf16) "
          "against plain decoding of the same prompts in the same run.\n")
    for name, title in SETS.items():
        path = Path(run_dir) / f"{name}.json"
        if path.is_file():
            print(f"## {title}\n\n{format_table(json.loads(path.read_text()))}\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/adaspec")
