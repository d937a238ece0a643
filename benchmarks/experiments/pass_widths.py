"""What a target pass costs by its width: a prompt chunk, then one-token steps and verification passes of 2..8 rows
over the same context, on one model and weight format (the lean step where the target has it).

    .venv/bin/python benchmarks/experiments/pass_widths.py --model qwen2.5-coder-1.5b --quant gguf-q8

Each width is timed `--repeats` times, the widths interleaved so machine noise hits them alike; the pass's new
slots are taken back after each (the cache's length restored), so every pass sees the same context. Prints ms a
pass (median) and its ratio to the one-token step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from foretell.api import load


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quant", default="gguf-q8")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--context", type=int, default=256, help="prompt tokens before the passes (default: %(default)s)")
    p.add_argument("--widths", default="1,2,3,4,5,6,8")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load(args.model, None, dtype=args.dtype, quant=args.quant).target.model
    widths = [int(w) for w in args.widths.split(",")]
    cache = model.new_cache(args.context + max(widths) + 8)
    ids = torch.randint(100, 1000, (args.context + max(widths),), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        start = time.perf_counter()
        model(ids[: args.context], torch.arange(args.context), cache)
        prefill = time.perf_counter() - start
        cache.length = args.context
        times: dict[int, list[float]] = {w: [] for w in widths}
        for _ in range(args.repeats + 1):  # the first round warms up
            for w in widths:
                start = time.perf_counter()
                model(ids[args.context: args.context + w], torch.arange(args.context, args.context + w), cache)
                times[w].append(time.perf_counter() - start)
                cache.length = args.context
    print(f"{args.model} {args.quant} {args.dtype}, {args.threads} threads: prompt of {args.context} tokens "
          f"{1000 * prefill:.0f} ms ({args.context / prefill:.1f} tok/s)")
    one = statistics.median(times[widths[0]][1:])
    for w in widths:
        ms = statistics.median(times[w][1:])
        print(f"  {w} rows: {1000 * ms:7.1f} ms  ({ms / one:.2f}x the {widths[0]}-row pass)")


if __name__ == "__main__":
    main()
