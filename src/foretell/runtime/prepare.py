"""prepare: a loaded PyTorch module made into the one that runs here, per a RuntimeConfig, for targets and drafters
alike. The steps, always in this order (each changes what the next sees):

1. numbers: a drafter's float32 parameters rounded to bf16 numbers (bf16_numbers), as its target's are;
2. weights: a GGUF file's own blocks (quant "gguf"), foretell's int8 / int4 (a drafter module by its own rule,
   drafter_modules.quantize_drafter), or as they are;
3. bf16 as float32: a bf16 CPU model runs as float32 activations over its bf16 weights, where the lean step suits
   it (then its wide passes multiply in bf16 where bf16 is native);
4. wide passes: WideLinear for a bf16 model on a CPU without native bf16 products (its passes of many rows in fp32,
   a few rows in foretell's bf16 kernel), or Bf16ProductLinear for a float32 module of bf16 numbers (bf16_rows);
5. compile (torch.compile of the per-layer blocks) or the lean step (passes of a few tokens in one native call);
6. the KV cache's dtype (kv_dtype), where one is asked for.
The module is changed in place (a drafter module's quantize may return another object: use the result's module).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from foretell.models.drafter_module import DrafterModule
from foretell.runtime import lean_step, quant, wide_linear
from foretell.runtime.config import RuntimeConfig, parse_dtype
from foretell.runtime.drafter_modules import quantize_drafter, use_lean_step
from foretell.runtime.gguf_quant import keep_gguf_quantization


@dataclass(frozen=True)
class Prepared:
    module: nn.Module
    bf16_as_float32: bool  # a bf16 model now runs as float32 activations over its bf16 weights (step 3)
    wide_rows: int | None  # its passes of this many rows or more run in fp32 (step 4, WideLinear); None: none do
    lean: str | None  # why the lean step does not run it, where it was asked for and does not apply


def prepare(module: nn.Module, config: RuntimeConfig) -> Prepared:
    c = config
    if c.bf16_numbers:
        round_to_bf16_numbers(module)
    module = quantize(module, c)
    as_float32 = (c.bf16_as_float32 and c.wide_fp32 and c.lean and not c.compile and c.quant == "none"
                  and lean_step.run_bf16_as_float32(module))
    wide = None
    if c.wide_fp32 and not as_float32 and c.wide_rows != 0:
        wide = wide_linear.widen_linears(module, c.wide_rows, kernel=c.kernel_rows)
    if c.bf16_rows:
        wide_linear.bf16_wide_products(module, c.bf16_rows)
    reason = None
    if c.compile:
        module.compile_steps()
    elif c.lean:  # where it does not apply, nothing changes (a target that needs it checks `lean`)
        use = module.use_lean_step if isinstance(module, lean_step.LeanTransformer) else partial(use_lean_step, module)
        reason = use(act_q8=True) if c.activations == "q8" else use()
    if c.kv_dtype is not None:
        module.kv_dtype = parse_dtype(c.kv_dtype)  # its new_cache's
    return Prepared(module, bool(as_float32), wide, reason)


def round_to_bf16_numbers(module: nn.Module) -> None:
    """The module's float32 parameters rounded to bf16 numbers, in place (they stay float32)."""
    with torch.no_grad():
        for param in module.parameters():
            if param.dtype == torch.float32:
                param.copy_(param.to(torch.bfloat16))


def quantize(module: nn.Module, config: RuntimeConfig) -> nn.Module:
    """Step 2: the weights in the format config.quant names. A drafter module (an EAGLE-3 head, a parallel head, a
    hidden-state draft) quantizes by its own rule (drafter_modules.quantize_drafter); a model is quantized as a
    target ("none", "int8",
    "int4"; "gguf" from config.gguf_file), or as a draft model where "auto" (int8 where it pays here)."""
    c = config
    if c.gguf_file is not None:
        keep_gguf_quantization(module, c.gguf_file)
        return module
    if c.quant is None:
        return module
    if isinstance(module, DrafterModule):
        return quantize_drafter(module, c.quant)
    if c.quant == "auto":
        return quant.apply_quant(module, c.quant)
    return quant.quantize_target(module, c.quant)


def drafter_runtime(target: nn.Module, device: str, dtype: str | torch.dtype, quant: str | None = None,
                    bf16_numbers: bool = False, q8: bool = False) -> RuntimeConfig:
    """The RuntimeConfig of a drafter module (a head, a hidden-state draft) on a prepared target: its weights
    rounded as the target's (bf16_numbers) and quantized per `quant`, on the target's wide-pass paths (its
    thresholds) and in the lean step where the target is; q8: with the target's 8-bit activations (a drafter whose
    lean step takes them: an EAGLE-3 head)."""
    lean = getattr(target, "lean", None)
    return RuntimeConfig(
        device=device, dtype=dtype, quant=quant, bf16_numbers=bf16_numbers, bf16_as_float32=False,
        wide_rows=wide_linear.wide_rows_of(target), kernel_rows=wide_linear.kernel_rows_of(target),
        bf16_rows=wide_linear.bf16_rows_of(target), lean=lean is not None,
        activations="q8" if q8 and lean is not None and lean.act_q8 else "float",
    )
