"""How a model runs on this machine: one frozen configuration, checked when it is made.

A RuntimeConfig says how `prepare` (runtime/prepare.py) turns a loaded PyTorch module into the one that runs: the
weights' format, the activations' format, which native paths it may take, compiled or not. A target's comes from
`load`'s arguments (or the CLI's flags); a drafter's from its target's, once the target is prepared, so that a
drafter takes the paths its target takes (`drafter_runtime`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from foretell.errors import ForetellError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The weights' format: foretell's weight-only int8 / int4, a GGUF file's own blocks (gguf_file), or "auto": int8
# where it pays here (drafters; runtime/quant.resolve_quant)
WEIGHT_FORMATS = ("none", "int8", "int4", "gguf", "auto")
# The activations entering the block projections: float (the model's dtype), or q8: 8 bits, as llama.cpp computes
# (float32 CPU models through the lean step only; lossy)
ACTIVATION_FORMATS = ("float", "q8")
# The target's KV cache: None keeps the model's dtype; float16 halves the bytes every pass reads from it (a lossy
# opt-in, as llama.cpp's default f16 cache; the lean step reads it natively, PyTorch's path widens it)
KV_DTYPES = (None, "float32", "float16")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ForetellError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


@dataclass(frozen=True)
class RuntimeConfig:
    """device, dtype: where the weights live and the dtype they load in (a torch.dtype is kept by its name).
    quant: the weights' format (WEIGHT_FORMATS), None: as they are (a drafter module without a quantization
    option); gguf_file: the GGUF file whose blocks quant="gguf" keeps. activations: ACTIVATION_FORMATS.
    bf16_numbers: first round the module's float32 parameters to bf16 numbers (a drafter of a bf16 target that runs
    as float32 activations over its bf16 weights).
    The native paths ("kernels"):
    bf16_as_float32: a bf16 model on CPU may run as float32 activations over its bf16 weights where the lean step
    suits it (runtime/lean_step.run_bf16_as_float32; with wide_fp32 and lean, without compile, quant "none").
    wide_fp32: a bf16 model on a CPU without native bf16 products runs its wide passes in fp32 (WideLinear).
    wide_rows, kernel_rows: WideLinear's thresholds (runtime/wide_linear.py), None: measured here; wide_rows 0: no
    WideLinear; kernel_rows 0: no bf16 kernel.
    bf16_rows: a float32 module of bf16 numbers multiplies passes of this many rows in bf16 (Bf16ProductLinear),
    None or 0: not as a step of its own (a target's comes with bf16_as_float32).
    lean: passes of a few tokens in one native call where the module suits it (runtime/lean_step.py).
    compile: torch.compile the module's per-layer blocks instead (Transformer.compile_steps).
    kv_dtype: a target's KV cache dtype (KV_DTYPES; None: the model's).
    """

    device: str = "cpu"
    dtype: str = "float32"
    quant: str | None = "none"
    gguf_file: Path | None = None
    activations: str = "float"
    bf16_numbers: bool = False
    bf16_as_float32: bool = True
    wide_fp32: bool = True
    wide_rows: int | None = None
    kernel_rows: int | None = None
    bf16_rows: int | None = None
    lean: bool = True
    compile: bool = False
    kv_dtype: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "device", str(self.device))
        if isinstance(self.dtype, torch.dtype):
            object.__setattr__(self, "dtype", str(self.dtype).removeprefix("torch."))
        if self.quant is not None and self.quant not in WEIGHT_FORMATS:
            raise ForetellError(f"unknown weight format {self.quant!r}; use one of {', '.join(WEIGHT_FORMATS)}")
        if self.gguf_file is not None and self.quant != "gguf":
            raise ForetellError(f"a GGUF file's blocks are kept with quant='gguf', not {self.quant!r}")
        if self.activations not in ACTIVATION_FORMATS:
            raise ForetellError(f"unknown activation format {self.activations!r}; use one of "
                                f"{', '.join(ACTIVATION_FORMATS)}")
        if self.activations == "q8" and (self.compile or not self.lean or self.dtype != "float32"
                                         or self.device != "cpu"):
            raise ForetellError(f"quant='{self.quant}-q8' (8-bit activations) runs in foretell's lean step: a "
                                "float32 target on CPU, without compile and with lean=True; "
                                f"use quant={self.quant!r} otherwise")
        parse_dtype(self.dtype)
        if self.kv_dtype not in KV_DTYPES:
            raise ForetellError(f"unknown KV cache dtype {self.kv_dtype!r}; use float32 or float16 (or None: the "
                                "model's dtype)")
        for name in ("wide_rows", "kernel_rows", "bf16_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ForetellError(f"{name} is a row count >= 0 or None (measured here), not {value!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
