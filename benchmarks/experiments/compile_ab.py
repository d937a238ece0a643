"""Does torch.compile pay for the target's forward on this machine? Eager against compiled blocks
(Transformer.compile_steps), interleaved, at the token counts decoding uses.

    .venv/bin/python benchmarks/experiments/compile_ab.py [--model smollm2-135m] [--quant none] [--threads 2]

Prints the median ms of one forward after a 256-token context, per token count, eager and compiled, and the
ratio. Two copies of the model, so each keeps its own kernels warm.
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.api import load

SIZES = (1, 2, 4, 8, 16, 32)


def ab_args(doc: str, repeats: int) -> argparse.Namespace:
    """The A/B scripts' shared options (--model, --threads, --repeats), torch's threads set."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=repeats)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    return args


def timer(model, context: int = 256, longest: int = max(SIZES)):
    """once(n): seconds of one pass of n <= longest tokens after `context` committed ones (not committed: the next
    pass overwrites them)."""
    cache = model.new_cache(context + longest + 1)
    ids = torch.randint(0, model.config.vocab_size, (context + longest,))
    with torch.inference_mode():
        model(ids[:context], torch.arange(context), cache)
    cache.commit_prefix(context)

    def once(n: int) -> float:
        with torch.inference_mode():
            start = time.perf_counter()
            model(ids[context:context + n], torch.arange(context, context + n), cache)
            return time.perf_counter() - start

    return once


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quant", default="none")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    eager = load(args.model, "none", dtype="bfloat16", quant=args.quant, warm_up=False).target.model
    compiled = load(args.model, "none", dtype="bfloat16", quant=args.quant, warm_up=False).target.model.compile_steps()
    runs = {"eager": timer(eager), "compiled": timer(compiled)}
    start = time.perf_counter()
    for n in SIZES:  # compile every size first
        runs["compiled"](n)
    print(f"compiling took {time.perf_counter() - start:.1f} s")
    print(f"| tokens ({args.model}, {args.quant}, bf16, {args.threads} threads) | eager ms | compiled ms | compiled / eager |")
    print("|---:|---:|---:|---:|")
    for n in SIZES:
        times = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():  # interleaved: machine drift hits both alike
                times[name].append(run(n))
        med = {name: sorted(t)[len(t) // 2] * 1000 for name, t in times.items()}
        print(f"| {n} | {med['eager']:.2f} | {med['compiled']:.2f} | {med['compiled'] / med['eager']:.2f} |")


if __name__ == "__main__":
    main()
