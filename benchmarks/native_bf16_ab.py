"""A bf16 target on a CPU with native bf16 products (AMX / AVX512-BF16): PyTorch's bf16 path against the lean step.

    .venv/bin/python benchmarks/native_bf16_ab.py [--model smollm2-135m] [--threads 2] [--repeats 9]

Until 2026-12-02 a bf16 target stayed in PyTorch's bf16 path wherever the CPU multiplies bf16 natively; now it runs
as float32 activations over its bf16 weights in the lean step there too (models/lean_step.run_bf16_as_float32),
its column products on AVX-512 where the CPU has it, and its prompts keep bf16 products on a bf16 copy of each
weight (wide_linear.Bf16ProductLinear). Prints two Markdown tables, every row measured in this one run, the
configurations interleaved: ms per forward of 1-32 tokens after a 256-token context (plain steps, verification
passes), and ms per prompt (a prefill into an empty cache). Medians of --repeats.
"""

from __future__ import annotations

import time

import torch

from compile_ab import ab_args, timer as pass_timer  # benchmarks/ is on the path when this runs as a script
from foretell.api import load
from foretell.kernels import lean_module
from foretell.models import wide_linear

SIZES = (1, 2, 4, 8, 12, 16, 24, 32)
PROMPTS = (64, 256, 512)


def prompt_timer(model):
    def once(n: int) -> float:
        ids = torch.arange(n) % model.config.vocab_size
        cache = model.new_cache(n + 1)
        with torch.inference_mode():
            start = time.perf_counter()
            model(ids, torch.arange(n), cache)
            return time.perf_counter() - start

    return once


def with_avx512(run, on: bool):
    def once(n: int) -> float:
        lean_module().lean_avx512(on)
        try:
            return run(n)
        finally:
            lean_module().lean_avx512(True)

    return once


def table(title: str, runs: dict, sizes, repeats: int) -> None:
    times = {name: {n: [] for n in sizes} for name in runs}
    for n in sizes:
        for _ in range(repeats):
            for name, run in runs.items():  # interleaved: the machine's drift hits every row alike
                times[name][n].append(run(n))
    print(f"\n| {title} | " + " | ".join(str(n) for n in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for name in runs:
        cells = [f"{sorted(t)[len(t) // 2] * 1000:.1f}" for t in times[name].values()]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    args = ab_args(__doc__, repeats=9)
    if not wide_linear.native_bf16():
        raise SystemExit("this CPU has no native bf16 products (AMX / AVX512-BF16): nothing to compare here")
    before = load(args.model, "none", dtype="bfloat16", lean=False, warm_up=False).target.model
    now = load(args.model, "none", dtype="bfloat16", warm_up=False).target.model
    avx512 = lean_module().lean_avx512(True)
    print(f"{args.model}, {args.threads} threads; now: {now.dtype} activations, lean step "
          f"{'on' if now.lean is not None else 'off'}, bf16 products from {wide_linear.bf16_rows_of(now)} rows, "
          f"AVX-512 columns {'on' if avx512 else 'unavailable'}")
    steps = {"PyTorch bf16 (before)": pass_timer(before), "lean step, AVX-512 columns (now)": pass_timer(now)}
    if avx512:
        steps["lean step, AVX2 columns"] = with_avx512(pass_timer(now), False)
    table("ms per forward, tokens after a 256-token context", steps, SIZES, args.repeats)
    prompts = {"PyTorch bf16 (before)": prompt_timer(before), "float32, bf16 products (now)": prompt_timer(now)}
    fp32 = load(args.model, "none", dtype="bfloat16", warm_up=False).target.model
    for layer in fp32.modules():
        if isinstance(layer, wide_linear.Bf16ProductLinear):
            layer.bf16_rows = 10**9  # a threshold no pass reaches: every product in float32
    prompts["float32 products"] = prompt_timer(fp32)
    table("ms per prompt of n tokens", prompts, PROMPTS, max(3, args.repeats // 3))


if __name__ == "__main__":
    main()
