"""What fetching the interleaved products' weights a few groups ahead buys a target pass, by its width.

    .venv/bin/python benchmarks/experiments/prefetch_ab.py --model smollm2-135m --quant gguf-q8

A prompt chunk, then passes of each width over the same context (the cache's length restored after each), with
the kernels' prefetch distance switched between the given settings (kernels/lean_decode.cpp `lean_prefetch`; 0:
the hardware prefetcher alone) pass by pass, so machine noise hits every setting alike. The arithmetic is the same
under every setting (the logits are compared); only the time differs. Prints ms a pass (median) per setting and
each setting's time over the first's.
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
    p.add_argument("--widths", default="1,2,4,6,8,12,16")
    p.add_argument("--settings", default="0,2", help="groups fetched ahead, the first the reference")
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    module = lean_module()
    if module is None:
        raise SystemExit("the lean kernels are not built here")
    model = load(args.model, None, dtype=args.dtype, quant=args.quant).target.model
    widths = [int(w) for w in args.widths.split(",")]
    settings = [int(s) for s in args.settings.split(",")]
    cache = model.new_cache(args.context + max(widths) + 8)
    ids = torch.randint(100, 1000, (args.context + max(widths),), generator=torch.Generator().manual_seed(0))
    times = {(w, s): [] for w in widths for s in settings}
    with torch.inference_mode():
        model(ids[: args.context], torch.arange(args.context), cache)
        cache.length = args.context
        for round_ in range(args.repeats + 1):  # the first round warms up
            for w in widths:
                logits = []
                for s in settings:
                    module.lean_prefetch(s)
                    start = time.perf_counter()
                    out = model(ids[args.context: args.context + w], torch.arange(args.context, args.context + w), cache)
                    times[w, s].append(time.perf_counter() - start)
                    cache.length = args.context
                    logits.append(out.logits)
                if round_ == 0 and not all(torch.equal(logits[0], other) for other in logits[1:]):
                    raise SystemExit(f"the settings' logits differ at width {w}: the prefetch changed the arithmetic")
    print(f"{args.model} {args.quant} {args.dtype}, {args.threads} threads, context {args.context}: "
          f"ms a pass (median of {args.repeats}) by groups fetched ahead")
    print(f"{'rows':>5s}" + "".join(f"{f'ahead {s}':>12s}" for s in settings)
          + "".join(f"{f'{s} / {settings[0]}':>10s}" for s in settings[1:]))
    for w in widths:
        ms = [1000 * statistics.median(times[w, s][1:]) for s in settings]
        print(f"{w:5d}" + "".join(f"{m:12.2f}" for m in ms) + "".join(f"{m / ms[0]:10.3f}" for m in ms[1:]))


if __name__ == "__main__":
    main()
