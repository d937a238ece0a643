"""What a target pass costs by its width: a prompt chunk, then one-token steps and verification passes of 2..8 rows
over the same context, on one model and weight format (the lean step where the target has it).

    .venv/bin/python benchmarks/experiments/pass_widths.py --model qwen2.5-coder-1.5b --quant gguf-q8
    .venv/bin/python benchmarks/experiments/pass_widths.py --prefetch 0,2 --widths 1,4,8,16 --repeats 20

Each width is timed `--repeats` times, the widths interleaved so machine noise hits them alike; the pass's new
slots are taken back after each (the cache's length restored), so every pass sees the same context. Prints ms a
pass (median) and its ratio to the narrowest pass. --prefetch: the lean kernels' prefetch distances to compare
(groups of 8 columns fetched ahead, kernels/lean/interleaved.h `lean_prefetch`; 0: the hardware prefetcher alone),
switched pass by pass, the first the reference; their logits must be equal (the arithmetic does not change).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from foretell.api import load
from foretell.kernels import lean_module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quant", default="gguf-q8")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--context", type=int, default=256, help="prompt tokens before the passes (default: %(default)s)")
    p.add_argument("--widths", default="1,2,3,4,5,6,8")
    p.add_argument("--prefetch", default="", help="prefetch distances to compare, e.g. 0,2 (default: the kernels' own)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    settings = [int(s) for s in args.prefetch.split(",")] if args.prefetch else [None]
    module = lean_module()
    if args.prefetch and module is None:
        raise SystemExit("--prefetch needs the lean kernels, which are not built here")
    model = load(args.model, None, dtype=args.dtype, quant=args.quant).target.model
    widths = [int(w) for w in args.widths.split(",")]
    cache = model.new_cache(args.context + max(widths) + 8)
    ids = torch.randint(100, 1000, (args.context + max(widths),), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        start = time.perf_counter()
        model(ids[: args.context], torch.arange(args.context), cache)
        prefill = time.perf_counter() - start
        cache.length = args.context
        times: dict[tuple, list[float]] = {(w, s): [] for w in widths for s in settings}
        for round_ in range(args.repeats + 1):  # the first round warms up
            for w in widths:
                logits = []
                for s in settings:
                    if s is not None:
                        module.lean_prefetch(s)
                    start = time.perf_counter()
                    out = model(ids[args.context: args.context + w], torch.arange(args.context, args.context + w),
                                cache)
                    times[w, s].append(time.perf_counter() - start)
                    cache.length = args.context
                    logits.append(out.logits)
                if round_ == 0 and not all(torch.equal(logits[0], other) for other in logits[1:]):
                    raise SystemExit(f"the prefetch settings' logits differ at width {w}: the arithmetic changed")
    print(f"{args.model} {args.quant} {args.dtype}, {args.threads} threads: prompt of {args.context} tokens "
          f"{1000 * prefill:.0f} ms ({args.context / prefill:.1f} tok/s)")
    if settings == [None]:
        one = statistics.median(times[widths[0], None][1:])
        for w in widths:
            ms = statistics.median(times[w, None][1:])
            print(f"  {w} rows: {1000 * ms:7.1f} ms  ({ms / one:.2f}x the {widths[0]}-row pass)")
        return
    print("ms a pass (median) by groups fetched ahead")
    print(f"{'rows':>5s}" + "".join(f"{f'ahead {s}':>12s}" for s in settings)
          + "".join(f"{f'{s} / {settings[0]}':>10s}" for s in settings[1:]))
    for w in widths:
        ms = [1000 * statistics.median(times[w, s][1:]) for s in settings]
        print(f"{w:5d}" + "".join(f"{m:12.2f}" for m in ms) + "".join(f"{m / ms[0]:10.3f}" for m in ms[1:]))


if __name__ == "__main__":
    main()
