"""The lean step's Q4X product (Q4_1 blocks, 8-bit activations: a GGUF Q4 target's projections) by rows, in cache.

    .venv/bin/python benchmarks/experiments/q4x_rows.py [--threads 1]

Random weights of SmolLM2-135M's gate_up (3072 x 576) and down (576 x 1536) shapes, small enough to stay in cache when
repeated, so the figure is the arithmetic's cost, not the memory's: GMAC/s and microseconds a row at 1 to 64 rows.
Compare two builds of kernels/lean_decode.cpp by running this at each commit (the kernel is rebuilt per source).
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.kernels import block_gemm
from foretell.runtime.lean_step import packed_projection
from foretell.runtime.quant import Int4Linear


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gemm = block_gemm()
    if gemm is None:
        raise SystemExit("the lean step's kernel is not built on this machine")
    for n, k in ((3072, 576), (576, 1536)):
        layer = Int4Linear.from_weight(torch.randn(n, k) * 0.02, None)
        kind, codes, scales, _ = packed_projection(layer, interleave=True)
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k)
            for _ in range(20):
                gemm(x, kind, codes, scales, True)
            repeats = max(20, 2000 // m)
            start = time.perf_counter()
            for _ in range(repeats):
                gemm(x, kind, codes, scales, True)
            seconds = (time.perf_counter() - start) / repeats
            print(f"{n} x {k}, {m:3d} rows: {m * n * k / seconds / 1e9:6.1f} GMAC/s, {seconds / m * 1e6:6.1f} us a row",
                  flush=True)


if __name__ == "__main__":
    main()
