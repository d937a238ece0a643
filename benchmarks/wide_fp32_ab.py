"""bf16 target with and without fp32 wide passes (models/wide_linear.py), side by side in one run.

Prints the forward cost curve (ms per forward by tokens, context 256) of SmolLM2-135M in bf16 as PyTorch runs it,
with wide passes in fp32, and in fp32; then generation speed (tok/s) of plain decoding, of the shipped default
drafter, and of that drafter without its result-cache branch, on GSM8K and Spec-Bench prompts, for the bf16 target
without and with wide passes, interleaved prompt by prompt.

    .venv/bin/python benchmarks/wide_fp32_ab.py [--prompts 2] [--max-new-tokens 64] [--threads 2]
"""

from __future__ import annotations

from dataclasses import replace

import torch

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.models.loading import load_model
from foretell.models.wide_linear import fp32_wide_rows, widen_linears
from ab_runs import SIZES, curve_row, interleaved_rates, parse_ab_args, print_rates


def main() -> None:
    args = parse_ab_args(__doc__)
    rows = fp32_wide_rows(args.threads)
    print(f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}; fp32 wide passes from {rows} rows "
          f"({'measured faster here' if rows else 'never faster here: bf16 is native'})\n")
    print("| ms per forward, tokens | " + " | ".join(map(str, SIZES)) + " |")
    print("|---|" + "---:|" * len(SIZES))
    bf16 = load_model("smollm2-135m", "bfloat16").model
    wide = load_model("smollm2-135m", "bfloat16").model
    widen_linears(wide, rows or 8)
    curve_row("bf16", bf16)
    curve_row(f"bf16, fp32 from {rows or 8} rows", wide)
    del bf16, wide
    curve_row("fp32", load_model("smollm2-135m", "float32").model)

    groups = {}
    for name, flag in (("bf16", False), ("bf16 wide", True)):
        default = load("smollm2-135m", None, dtype="bfloat16", wide_fp32=flag)
        groups[f"plain {name}"] = default.with_speculative("none")
        groups[f"default drafter {name}"] = default
        no_cache = replace(default.speculative, result_cache=None)
        groups[f"{no_cache.method} auto, no result cache, {name}"] = default.with_speculative(no_cache)
    rate = interleaved_rates(groups, load_prompts(["gsm8k", "spec-bench"], args.prompts), args.max_new_tokens)
    print_rates(rate, "plain bf16", lambda key: "plain bf16 wide" if key.endswith("bf16 wide") else "plain bf16",
                ("vs plain bf16", "vs plain, same passes"))


if __name__ == "__main__":
    main()
