"""How close the lean step's multi-row products come to this CPU's 8-bit dot-product peak.

    .venv/bin/python benchmarks/experiments/int8_peak.py

The peak: a loop of independent AVX-512 VNNI dot products (vpdpbusd, 256- and 512-bit; 32 and 64 multiply-adds an
instruction) on each of --threads threads at once, nothing else. The kernel: foretell's Q4X product with 8-bit
activations (what a GGUF Q4 target's verification rows run, kernels/lean/interleaved.h `group_q4x_vnni`) over
SmolLM2-135M's and Qwen2.5-Coder-1.5B's projection shapes at 1 to 16 rows (random weights, small enough to stay
in cache when repeated: the arithmetic's cost, not the memory's). A pass past ~4 rows costs its rows' dot
products: where the kernel is near the peak, more rows a pass cannot get cheaper on this CPU (docs/serving.md).
Needs a CPU with AVX-512 VNNI.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

PEAK_SOURCE = r"""
#include <immintrin.h>
#include <cstring>
#include <torch/extension.h>

// n rounds of 12 independent dot products (no dependency between them: throughput, not latency); V: a 256- or
// 512-bit register of bytes, dot: its vpdpbusd
template <class V, class Dot>
int64_t dot_loop(int64_t n, V w, V x, Dot dot) {
  V acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = x;
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 12; ++i) acc[i] = dot(acc[i], w, x);
    asm volatile("" : "+v"(w));  // the compiler may not hoist the products out of the loop
  }
  int32_t first;
  std::memcpy(&first, &acc[11], 4);
  return first;
}

int64_t dots(int64_t n, bool wide) {
  if (wide)
    return dot_loop(n, _mm512_set1_epi8(3), _mm512_set1_epi8(5),
                    [](__m512i a, __m512i w, __m512i x) { return _mm512_dpbusd_epi32(a, w, x); });
  return dot_loop(n, _mm256_set1_epi8(3), _mm256_set1_epi8(5),
                  [](__m256i a, __m256i w, __m256i x) { return _mm256_dpbusd_epi32(a, w, x); });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dots", &dots, py::call_guard<py::gil_scoped_release>());
}
"""


def peak(module, wide: bool, threads: int, rounds: int) -> float:
    """GMAC/s of `threads` threads each running the dot-product loop at once."""
    per_instruction = 64 if wide else 32
    module.dots(rounds // 10, wide)  # warm-up (clocks up)
    workers = [threading.Thread(target=module.dots, args=(rounds, wide)) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return threads * rounds * 12 * per_instruction / (time.perf_counter() - start) / 1e9


def kernel_rate(n: int, k: int, rows: int, repeats: int) -> float:
    """GMAC/s of foretell's Q4X product (8-bit activations) of `rows` rows over an [n, k] weight."""
    from foretell.kernels import Q4, lean_module
    from foretell.runtime.lean_step import interleaved
    from foretell.runtime.quant import Int4Linear, q4_blocks

    kind, main, scales = interleaved(Q4, *q4_blocks(Int4Linear.from_weight(torch.randn(n, k))))
    x = torch.randn(rows, k)
    gemm = lean_module().block_gemm
    for _ in range(3):
        gemm(x, kind, main, scales, True)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gemm(x, kind, main, scales, True)
        times.append(time.perf_counter() - start)
    return n * k * rows / sorted(times)[len(times) // 2] / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=100_000_000, help="dot-product loop rounds a thread")
    p.add_argument("--repeats", type=int, default=50, help="timed products a shape and width (median)")
    p.add_argument("--tries", type=int, default=5, help="peak measurements (the best is kept)")
    args = p.parse_args()
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        raise SystemExit("this CPU has no AVX-512: the VNNI peak does not apply")
    from torch.utils.cpp_extension import load_inline

    flags = ["-O2", "-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512vnni"]  # only built where the CPU has them
    module = load_inline("foretell_int8_peak_v2", cpp_sources=[PEAK_SOURCE], extra_cflags=flags, verbose=False)
    torch.set_num_threads(args.threads)
    # the best of a few tries: the machine's noise only ever slows a try down
    wide = max(peak(module, True, args.threads, args.rounds) for _ in range(args.tries))
    narrow = max(peak(module, False, args.threads, args.rounds) for _ in range(args.tries))
    best = max(wide, narrow)
    print(f"dot-product peak, {args.threads} threads: {narrow:.0f} GMAC/s (256-bit), {wide:.0f} (512-bit)")
    shapes = {"SmolLM2 gate_up": (3072, 576), "SmolLM2 down": (576, 1536), "SmolLM2 output": (49152, 576),
              "Qwen 1.5B gate_up": (17920, 1536), "Qwen 1.5B down": (1536, 8960)}
    print(f"{'Q4X product, 8-bit activations':32s}" + "".join(f"{f'{r} rows':>16s}" for r in (1, 4, 8, 16)))
    for name, (n, k) in shapes.items():
        rates = [kernel_rate(n, k, rows, args.repeats) for rows in (1, 4, 8, 16)]
        print(f"{name + f' {n}x{k}':32s}" + "".join(f"{r:8.0f} ({r / best:4.0%})" for r in rates))
    print("(GMAC/s, and the share of the peak)")


if __name__ == "__main__":
    main()
