"""Weight-only int8 linear layers for draft models.

A batch-size-1 decode step is memory-bound: it streams every weight once per token. Storing a
draft's weights as int8 (one scale per output row) halves the bytes of bf16, and on CPU
PyTorch's `_weight_int8pack_mm` kernel turns that into 2-3x faster projections (measured on
this machine's 2 cores: 0.79 -> 0.27 ms for a 896x9728 projection at one token).

Quantizing the *draft* is lossless for foretell's output: the target still verifies every
token against its own full-precision distribution. Only the draft's proposals (and so the
acceptance rate) can change. Quantizing a target would not be lossless and is not offered here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

QUANT_MODES = ("none", "int8", "auto")
# The fused kernel is built for a few rows (decode steps); for a prefill of hundreds of tokens it
# is 2-3x slower than dequantizing the weight and running a dense matmul (measured here).
FUSED_MAX_ROWS = 32


class Int8Linear(nn.Module):
    """y = x @ (int8 weight * per-row scale).T + bias, computed in the activations' dtype."""

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight_int8", weight_int8)  # [out, in] int8
        self.register_buffer("scale", scale)  # [out], the model dtype
        self.register_buffer("bias", bias)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scale.to(weight.dtype), None if bias is None else bias.detach().clone())

    @property
    def out_features(self) -> int:
        return self.weight_int8.shape[0]

    def select_rows(self, rows: torch.Tensor) -> Int8Linear:
        """The layer restricted to some output rows (a hot vocabulary of an output layer)."""
        rows = rows.to(self.weight_int8.device)
        bias = None if self.bias is None else self.bias.index_select(0, rows)
        return Int8Linear(
            self.weight_int8.index_select(0, rows).contiguous(), self.scale.index_select(0, rows), bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if flat.device.type == "cpu" and flat.shape[0] <= FUSED_MAX_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), self.weight_int8, self.scale.to(x.dtype))
        else:  # many rows (a prefill) or no fused kernel: dequantize on the fly, then a dense matmul
            y = F.linear(flat, self.weight_int8.to(x.dtype)) * self.scale.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)


def select_rows(layer: nn.Module, rows: torch.Tensor) -> nn.Module:
    """Keep only some output rows of a linear layer, plain or int8 (a copy, contiguous for speed)."""
    if isinstance(layer, Int8Linear):
        return layer.select_rows(rows)
    rows = rows.to(layer.weight.device)
    out = nn.Linear(layer.in_features, rows.numel(), bias=layer.bias is not None,
                    device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(layer.weight.index_select(0, rows))
        if layer.bias is not None:
            out.bias.copy_(layer.bias.index_select(0, rows))
    return out.requires_grad_(False)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by an Int8Linear; embeddings stay as they are.

    A tied output layer is untied first: the embedding lookup keeps its full-precision table.
    """
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear.from_weight(child.weight, child.bias))
    return model


def resolve_quant(mode: str, device: str | torch.device) -> str:
    """"auto" -> int8 on CPU (where the fused kernel exists), none elsewhere."""
    if mode not in QUANT_MODES:
        from foretell.errors import ForetellError

        raise ForetellError(f"unknown draft quantization {mode!r}; use one of {', '.join(QUANT_MODES)}")
    if mode == "auto":
        return "int8" if torch.device(device).type == "cpu" else "none"
    return mode


def apply_quant(model: nn.Module, mode: str) -> nn.Module:
    """Quantize `model` in place per `mode` ("none", "int8" or "auto", see resolve_quant)."""
    device = next(model.parameters()).device
    return quantize_int8(model) if resolve_quant(mode, device) == "int8" else model
