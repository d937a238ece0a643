"""bf16 target with and without fp32 wide passes (models/wide_linear.py), side by side in one run.

Prints the forward cost curve (ms per forward by tokens, context 256) of SmolLM2-135M in bf16 as PyTorch runs it,
with wide passes in fp32, and in fp32; then generation speed (tok/s) of plain decoding, of the shipped default
drafter, and of that drafter without its result-cache branch, on GSM8K and Spec-Bench prompts, for the bf16 target
without and with wide passes, interleaved prompt by prompt.

    .venv/bin/python benchmarks/wide_fp32_ab.py [--prompts 2] [--max-new-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.budget import measure_cost_curve
from foretell.models.loading import load_model
from foretell.models.wide_linear import fp32_wide_rows, widen_linears

SIZES = (1, 2, 4, 8, 16, 32, 64)


def curve_row(name: str, model) -> list[float]:
    ms = [s * 1000 for s in measure_cost_curve(model, sizes=SIZES, repeats=3).seconds]
    print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in ms) + " |", flush=True)
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2, help="prompts per category (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
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
    prompts = load_prompts(["gsm8k", "spec-bench"], args.prompts)
    seconds, tokens = {}, {}
    for i, prompt in enumerate(prompts):
        for key, pipe in groups.items():
            start = time.perf_counter()
            result = pipe.generate(prompt["prompt"], max_new_tokens=args.max_new_tokens)
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
            tokens[key] = tokens.get(key, 0) + len(result.tokens)
        print(f"prompt {i + 1}/{len(prompts)}", flush=True)
    print("\n| method | tok/s | vs plain bf16 | vs plain, same passes |\n|---|---:|---:|---:|")
    rate = {key: tokens[key] / seconds[key] for key in seconds}
    for key in seconds:
        same = "plain bf16 wide" if key.endswith("bf16 wide") else "plain bf16"
        print(f"| {key} | {rate[key]:.1f} | {rate[key] / rate['plain bf16']:.2f}x | {rate[key] / rate[same]:.2f}x |")

if __name__ == "__main__":
    main()
