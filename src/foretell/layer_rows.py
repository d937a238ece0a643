"""Some output rows of a linear layer, copied: a hot vocabulary's cut of an output layer (hot_vocab.py), whatever
the layer's format. Each quantized or wrapped layer type of runtime/ cuts itself (its own select_rows)."""

from __future__ import annotations

import torch
from torch import nn


def select_rows(layer: nn.Module, rows: torch.Tensor) -> nn.Module:
    """Keep only some output rows of a linear layer, plain or quantized (a copy, contiguous for speed): a layer
    type with its own select_rows (the quantized ones, GGUFLinear, WideLinear) cuts itself, any other is copied
    as a dense nn.Linear."""
    own = getattr(type(layer), "select_rows", None)
    return own(layer, rows) if own is not None else dense_rows(layer, rows)


def dense_rows(layer: nn.Module, rows: torch.Tensor) -> nn.Linear:
    """Some output rows of a layer with a dense weight (and bias), copied into a contiguous nn.Linear."""
    rows = rows.to(layer.weight.device)
    out = nn.Linear(layer.in_features, rows.numel(), bias=layer.bias is not None,
                    device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(layer.weight.index_select(0, rows))
        if layer.bias is not None:
            out.bias.copy_(layer.bias.index_select(0, rows))
    return out.requires_grad_(False)
