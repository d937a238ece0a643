"""Native kernels foretell builds once on first use (torch.utils.cpp_extension), each with a PyTorch fallback.

bf16_gemm.cpp: bf16 weights times a few fp32 rows on x86 CPUs with AVX2, for CPUs without a native bf16 matrix
multiply (runtime/wide_linear.py decides where it pays).
lean_decode.cpp: a whole one-token decode step of a Llama-shaped model in one call (runtime/lean_step.py); its
parts are the headers in lean/ (one a weight kind or instruction set; lean_decode.cpp's opening comment lists them).
Building needs a C++ compiler and ninja; where either is
missing, or the CPU is not x86 with AVX2, foretell says so once and uses PyTorch's products. FORETELL_NO_KERNELS=1
turns the kernels off (A/B runs).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import sys
from pathlib import Path

import torch

from foretell.paths import default_cache_dir

FOLDER = Path(__file__).parent

# The kinds of packed weights lean_decode.cpp reads (its numbering, a row each in lean/kinds.h; the layouts:
# runtime/lean_step.py)
Q4, Q8, F32 = 0, 1, 2  # Q4_1 blocks (int4), Q8_0 blocks (int8), dense fp32
Q4X, Q8X = 3, 4  # the same blocks with 8 output columns interleaved, for 8-bit activations
BF16, BF16X = 5, 6  # a dense weight of bf16 numbers as bf16; BF16X: 16 output columns interleaved
I8X = 7  # int8 with a scale per output row, 16 output columns interleaved
BF16A = 8  # bf16 in AMX's tile layout (bf16 products on the tiles)
GGUF_KIND = 9  # a GGUF file's blocks as it ships them, parts of rows in their own types
KQ4X, KQ6X = 10, 11  # Q4_K / Q6_K blocks with 8 output columns interleaved, for 8-bit activations (lean_step.gguf_records)


def kernels_allowed() -> bool:
    return not os.environ.get("FORETELL_NO_KERNELS") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@functools.cache
def bf16_small_gemm():
    """The kernel's function (x fp32 [M, K], w bf16 [N, K]) -> fp32 [M, N], or None where it cannot be used here."""
    module = build("bf16_gemm", "the bf16 kernel", "bf16 passes of several rows use PyTorch's products")
    return None if module is None else module.bf16_small_gemm


@functools.cache
def lean_module():
    return build("lean_decode", "the lean decode kernels", "one-token steps and fp32 int4 products run in PyTorch")


def lean_decode():
    """The one-token decode step (kernels/lean_decode.cpp), or None where it cannot be used here."""
    module = lean_module()
    return None if module is None else module.lean_decode


def amx_products() -> bool:
    """Whether a bf16 model's lean passes multiply on AMX tiles here (lean_decode.cpp's BF16A: where the CPU has
    AMX and Linux grants its tile state; lean_amx(False) turns it off for A/B runs)."""
    module = lean_module()
    return module is not None and module.amx_enabled()


def cpu_class() -> str:
    """This CPU's class for choosing a default drafter, as the drafters' speed ranks differ between them: "amx"
    where bf16 passes multiply on AMX tiles (a verification pass costs about a step), else the widest vectors
    PyTorch uses here ("avx512", "avx2"), else "other"."""
    if amx_products():
        return "amx"
    return {"AVX512": "avx512", "AVX2": "avx2"}.get(torch.backends.cpu.get_cpu_capability(), "other")


def block_gemm():
    """(x fp32 [M, K], kind, codes, scales[, act_q8]) -> fp32 [M, N] for the packed weights lean_decode.cpp reads
    (Q4_1 / Q8_0 blocks, a GGUF file's blocks, bf16 or int8 columns), or None where not built here."""
    module = lean_module()
    return None if module is None else module.block_gemm


# The headers each kernel's .cpp includes, by folder (kernels/lean/*.h for lean_decode.cpp)
HEADERS = {"lean_decode": "lean"}


def source_files(name: str) -> list[Path]:
    """kernels/NAME.cpp and every header it includes."""
    headers = sorted((FOLDER / HEADERS[name]).glob("*.h")) if name in HEADERS else []
    return [FOLDER / f"{name}.cpp", *headers]


def source_key(name: str) -> str:
    """A key of kernels/NAME.cpp, its headers (each named) and torch's version: a change to any of them builds anew."""
    cpp, *headers = source_files(name)
    digest = hashlib.sha256(cpp.read_bytes())
    for header in headers:
        digest.update(header.relative_to(FOLDER).as_posix().encode() + b"\0" + header.read_bytes())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()[:12]


def build_folder(name: str) -> tuple[Path, str]:
    """Where kernels/NAME.cpp is built, and the key of its sources and torch version that names the folder."""
    key = source_key(name)
    return default_cache_dir() / "kernels" / f"{name}-{key}", key


def clear_stale_lock(folder: Path) -> None:
    """Remove the lock file torch's build leaves behind when its process is killed mid-build (Ctrl-C on the first
    run), on which every later load would wait forever. Called holding build.flock, which every foretell build
    takes first, so no build is running: the file is stale."""
    stale = folder / "lock"
    if stale.exists():
        stale.unlink()
        print(f"foretell: removed {stale}, left by an interrupted kernel build", file=sys.stderr)


def build(name: str, what: str, fallback: str):
    """kernels/NAME.cpp compiled for this CPU (cached by its sources and torch version), or None, said once, where it
    cannot be built or used here. The .cpp includes its headers by relative path (lean_decode.cpp: "lean/...")."""
    if not kernels_allowed():
        return None
    source = FOLDER / f"{name}.cpp"
    folder, key = build_folder(name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "build.flock", "w") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)  # the OS drops it when its process dies, unlike torch's lock file
            clear_stale_lock(folder)
            if not any(folder.glob("*.so")):
                print(f"foretell: building {what} for this CPU (once, about a minute)", file=sys.stderr)
            # start-up: the extension builder (~0.15 s to import) is needed only when a kernel is built or loaded
            from torch.utils.cpp_extension import load

            return load(name=f"foretell_{name}_{key}", sources=[str(source)], build_directory=str(folder),
                        extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"], extra_ldflags=["-fopenmp"],
                        verbose=False)  # OpenMP: at::parallel_for spreads the output rows over torch's threads
    except Exception as e:  # no compiler, no ninja, an unwritable cache: PyTorch's products still work
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
        print(f"foretell: {what} could not be built here ({reason}); {fallback} (set FORETELL_NO_KERNELS=1 to "
              "skip the attempt)", file=sys.stderr)
        return None
