"""What one batched target pass costs by its shape: S sequences (the clients) with W rows each (a one-token step
is W = 1; a request verifying d draft tokens brings 1 + d rows), through runtime.packed.forward_packed, the call
the batching engine makes.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/experiments/packed_widths.py --sequences 4 --widths 1,2,3,4
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/experiments/packed_widths.py --sequences 16 --widths 1 \
        --kv-dtypes float32,float16 --context 400     # the KV cache's dtype, side by side

Each shape is timed `--repeats` times, the shapes interleaved so machine noise hits them alike; every pass's new
slots are taken back afterwards (the caches' lengths restored), so every pass sees the same contexts. Prints ms a
pass (median) for each --kv-dtypes entry (the target's KV cache dtype; shapes and dtypes interleaved), ms a draft
row (beyond the one-token step), and the accepted draft tokens a request must gain per
pass for speculation to match plain batched decoding (pass(W) / pass(1) - 1) and to beat it 1.2x (1.2 pass(W) /
pass(1) - 1); W - 1 draft tokens in a chain accepted a a token each give a + a^2 + ... + a^(W-1).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from foretell.api import load
from foretell.decoding import TargetPass
from foretell.runtime.config import parse_dtype
from foretell.runtime.packed import forward_packed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quant", default="gguf-q8")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--context", type=int, default=200, help="tokens in each sequence's cache (default: %(default)s)")
    p.add_argument("--widths", default="1,2,3,4")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-dtypes", default="float32", help="KV cache dtypes to compare, e.g. float32,float16")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load(args.model, None, dtype=args.dtype, quant=args.quant).target.model
    widths = [int(w) for w in args.widths.split(",")]
    gen = torch.Generator().manual_seed(0)
    # contexts of different lengths, as a batch's requests have
    contexts = [args.context + 17 * i for i in range(args.sequences)]
    ids = [torch.randint(100, 1000, (c + max(widths),), generator=gen) for c in contexts]
    kv_dtypes = args.kv_dtypes.split(",")
    caches = {}
    with torch.inference_mode():
        for kv in kv_dtypes:
            model.kv_dtype = parse_dtype(kv)
            caches[kv] = [model.new_cache(c + max(widths) + 8) for c in contexts]
            for cache, c, seq in zip(caches[kv], contexts, ids):
                model(seq[:c], torch.arange(c), cache)
                cache.length = c
        times: dict[tuple, list[float]] = {(w, kv): [] for w in widths for kv in kv_dtypes}
        for round_ in range(args.repeats + 1):  # the first round warms up
            for w in widths:
                for kv in kv_dtypes:
                    passes = [TargetPass(seq[c: c + w], torch.arange(c, c + w), cache)
                              for cache, c, seq in zip(caches[kv], contexts, ids)]
                    start = time.perf_counter()
                    forward_packed(model, passes)
                    times[w, kv].append(time.perf_counter() - start)
                    for cache, c in zip(caches[kv], contexts):
                        cache.length = c
    print(f"{args.model} {args.quant} {args.dtype}, {args.threads} threads, {args.sequences} sequences "
          f"(contexts {contexts[0]}..{contexts[-1]})")
    for kv in kv_dtypes:
        one = statistics.median(times[widths[0], kv][1:])
        print(f"KV cache {kv}")
        print(f"{'rows/seq':>8s} {'ms/pass':>8s} {'ms/row':>7s} {'ms/draft row':>13s} {'tokens to break even':>21s} "
              f"{'tokens for 1.2x':>16s}")
        for w in widths:
            ms = 1000 * statistics.median(times[w, kv][1:])
            extra = (ms - 1000 * one) / (args.sequences * (w - 1)) if w > 1 else float("nan")
            # accepted tokens a request must add per pass so that pass(w) yields as many tokens a ms as pass(1), and
            # 1.2x
            even, faster = ms / (1000 * one) - 1, 1.2 * ms / (1000 * one) - 1
            print(f"{w:8d} {ms:8.2f} {ms / (args.sequences * w):7.2f} {extra:13.2f} {even:21.2f} {faster:16.2f}")
    if len(kv_dtypes) > 1:
        base = kv_dtypes[0]
        for kv in kv_dtypes[1:]:
            ratios = [statistics.median(times[w, kv][1:]) / statistics.median(times[w, base][1:]) for w in widths]
            print(f"ms a pass, KV {kv} / {base}: " + ", ".join(f"{w} rows {r:.3f}" for w, r in zip(widths, ratios)))


if __name__ == "__main__":
    main()
