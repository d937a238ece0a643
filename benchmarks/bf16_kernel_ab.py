"""A bf16 target with and without foretell's bf16 kernel (kernels/bf16_gemm.cpp), side by side in one run.

On a CPU without a native bf16 matmul, wide bf16 passes run in fp32 (models/wide_linear.py); the kernel takes the
passes of 2..kernel_rows rows (draft trees) instead. Prints the forward cost curve (ms per forward by tokens,
context 256) of SmolLM2-135M in bf16 without and with the kernel, and in fp32; then generation speed (tok/s) of
plain decoding, the shipped default drafter, EAGLE-3 auto without the result cache, and prompt lookup, on GSM8K and
Spec-Bench prompts, without the kernel (and with an int8 head, what draft_quant "auto" gave then) and with it, interleaved prompt by prompt. First, the one-token forward
(context 300) with its attention in bf16 and in fp32 (DecoderLayer.attention_fp32, set with wide passes),
interleaved, median of 40 each.

    .venv/bin/python benchmarks/bf16_kernel_ab.py [--prompts 2] [--max-new-tokens 64] [--threads 2]
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.models.loading import load_model
from foretell.models.wide_linear import fp32_wide_rows, kernel_rows, widen_linears
from ab_runs import SIZES, curve_row, interleaved_rates, parse_ab_args, print_rates


def one_token_attention_ab(repeats: int = 40) -> None:
    model = load_model("smollm2-135m", "bfloat16").model
    widen_linears(model)
    context = 300
    cache = model.new_cache(context + 1)
    ids = torch.randint(0, model.config.vocab_size, (context + 1,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(ids[:context], torch.arange(context), cache)
    cache.commit_prefix(context)
    times = {True: [], False: []}
    for _ in range(repeats):
        for fp32 in times:
            for layer in model.layers:
                layer.attention_fp32 = fp32
            start = time.perf_counter()
            with torch.inference_mode():
                model(ids[context:], torch.arange(context, context + 1), cache)
            times[fp32].append(time.perf_counter() - start)
            cache.truncate(context)
    median = {fp32: sorted(t)[len(t) // 2] * 1000 for fp32, t in times.items()}
    print(f"one-token forward, context {context}: attention in bf16 {median[False]:.1f} ms, in fp32 "
          f"{median[True]:.1f} ms ({median[False] / median[True]:.2f}x)\n", flush=True)


def main() -> None:
    args = parse_ab_args(__doc__)
    wide, kernel = fp32_wide_rows(args.threads), kernel_rows(args.threads)
    print(f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}; fp32 wide passes from {wide} rows; "
          f"the bf16 kernel for 2..{kernel} rows (0: not built or not faster here)\n")
    one_token_attention_ab()
    print("| ms per forward, tokens | " + " | ".join(map(str, SIZES)) + " |")
    print("|---|" + "---:|" * len(SIZES))
    for name, k in (("bf16, PyTorch products", 0), (f"bf16, kernel for 2..{kernel} rows", kernel)):
        model = load_model("smollm2-135m", "bfloat16").model
        widen_linears(model, wide or 8, kernel=k)
        curve_row(name, model)
        del model
    curve_row("fp32", load_model("smollm2-135m", "float32").model)

    groups = {}
    for name, flag in (("PyTorch", False), ("kernel", True)):
        default = load("smollm2-135m", None, dtype="bfloat16", bf16_kernel=flag)
        # Without the kernel, draft_quant "auto" meant an int8 head (PyTorch's int8 kernel), as before it existed.
        spec = default.speculative if flag else replace(default.speculative, draft_quant="int8")
        groups[f"plain, {name}"] = default.with_speculative("none")
        groups[f"default drafter, {name}"] = default.with_speculative(spec)
        no_cache = replace(spec, result_cache=None)
        groups[f"{no_cache.method} auto, no result cache, {name}"] = default.with_speculative(no_cache)
        groups[f"prompt lookup, {name}"] = default.with_speculative("prompt-lookup")
    rate = interleaved_rates(groups, load_prompts(["gsm8k", "spec-bench"], args.prompts), args.max_new_tokens)
    print_rates(rate, "plain, PyTorch", lambda key: "plain, kernel" if key.endswith("kernel") else "plain, PyTorch",
                ("vs plain, PyTorch", "vs plain, same products"))


if __name__ == "__main__":
    main()
