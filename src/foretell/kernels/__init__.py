"""Native kernels foretell builds once on first use (torch.utils.cpp_extension), each with a PyTorch fallback.

bf16_gemm.cpp: bf16 weights times a few fp32 rows on x86 CPUs with AVX2, for CPUs without a native bf16 matrix
multiply (models/wide_linear.py decides where it pays). Building needs a C++ compiler and ninja; where either is
missing, or the CPU is not x86 with AVX2, foretell says so once and uses PyTorch's products. FORETELL_NO_KERNELS=1
turns the kernels off (A/B runs).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("bf16_gemm.cpp")


def kernels_allowed() -> bool:
    return not os.environ.get("FORETELL_NO_KERNELS") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@functools.cache
def bf16_small_gemm():
    """The kernel's function (x fp32 [M, K], w bf16 [N, K]) -> fp32 [M, N], or None where it cannot be used here."""
    if not kernels_allowed():
        return None
    from foretell.models.loading import default_cache_dir

    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    folder = default_cache_dir() / "kernels" / f"bf16_gemm-{key}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not any(folder.glob("*.so")):
            print("foretell: building the bf16 kernel for this CPU (once, about a minute)", file=sys.stderr)
        from torch.utils.cpp_extension import load

        module = load(name=f"foretell_bf16_gemm_{key}", sources=[str(SOURCE)], build_directory=str(folder),
                      extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"],
                      verbose=False)  # OpenMP: at::parallel_for spreads the output rows over torch's threads
        return module.bf16_small_gemm
    except Exception as e:  # no compiler, no ninja, an unwritable cache: PyTorch's products still work
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
        print(f"foretell: the bf16 kernel could not be built here ({reason}); bf16 passes of several rows use "
              "PyTorch's products (set FORETELL_NO_KERNELS=1 to skip the attempt)", file=sys.stderr)
        return None
