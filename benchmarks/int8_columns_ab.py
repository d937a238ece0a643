"""A drafter's int8 layers in foretell's kernels: I8X (16 output columns interleaved, a scale per column) against
the same codes as Q8 blocks of 32 (the layout before) and a bf16 weight of the same shapes, ms for all of an
EAGLE-3 head's projections at 1, 4 and 6 rows (a tree level), interleaved, min / median of --repeats.

    .venv/bin/python benchmarks/int8_columns_ab.py [--threads 2] [--repeats 40]

Shapes: SmolLM2-135M's EAGLE-3 head (qkv reads [embeddings, hidden], an 8192-token draft vocabulary).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from foretell.kernels import block_gemm
from foretell.models.lean_step import I8X, Q8, bf16_interleaved
from foretell.models.quant import Int8Linear

SHAPES = [(960, 1152), (576, 576), (3072, 576), (576, 1536), (8192, 576)]  # qkv, o, gate_up, down, lm_head


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gemm = block_gemm()
    if gemm is None:
        raise SystemExit("foretell's kernels are not built on this machine")
    layers = [Int8Linear.from_weight(torch.randn(n, k)) for n, k in SHAPES]
    layouts = {
        "int8, I8X columns": [(I8X, x.columns16(), x.scale.float()) for x in layers],
        "int8, Q8 blocks": [(Q8, x.weight_int8, x.scales_by_block()) for x in layers],
        "bf16, BF16X columns": [(*bf16_interleaved(torch.randn(n, k).bfloat16()), torch.empty(0)) for n, k in SHAPES],
    }
    print(f"| ms for the head's projections ({args.threads} threads, min / median) | 1 row | 4 rows | 6 rows |")
    print("|---|---:|---:|---:|")
    cells = {name: [] for name in layouts}
    for rows in (1, 4, 6):
        inputs = {k: torch.randn(rows, k) for _, k in SHAPES}
        times = {name: [] for name in layouts}
        for _ in range(args.repeats):
            for name, weights in layouts.items():
                start = time.perf_counter()
                for (kind, w, s), (_, k) in zip(weights, SHAPES):
                    gemm(inputs[k], kind, w, s)
                times[name].append(time.perf_counter() - start)
        for name, t in times.items():
            cells[name].append(f"{min(t) * 1e3:.2f} / {statistics.median(t) * 1e3:.2f}")
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
