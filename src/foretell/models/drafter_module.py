"""What the drafter modules built on a target share (parallel head, hidden-state draft, EAGLE-3 head).

Each is made in its target's dtype on its device and keeps its own KV cache and RoPE tables. Its dtype and
device are read off one of its own weights, `placed_by`: cheaper than walking its parameters, and these are
asked for at every draft step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from foretell.errors import ForetellError
from foretell.kv_cache import KVCache
from foretell.models.config import ModelConfig


@dataclass(frozen=True)
class TargetSizes:
    """The target's sizes a drafter's config starts with: its layers are shaped like the target's."""

    hidden_size: int  # the drafter reads the target's hidden states or embeddings at this width
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary


def check_target_sizes(config, target: ModelConfig, what: str, use: str) -> None:
    """A drafter's config (hidden_size, vocab_size, target_num_layers) must match `target`'s; `what` names the
    drafter in the error and `use` what to use instead, e.g. "a head"."""
    mine = (config.hidden_size, config.vocab_size, config.target_num_layers)
    theirs = (target.hidden_size, target.vocab_size, target.num_hidden_layers)
    if mine != theirs:
        raise ForetellError(
            f"this {what} was built for a target with hidden size {mine[0]}, vocabulary {mine[1]} and "
            f"{mine[2]} layers, but the target has {theirs[0]}, {theirs[1]} and {theirs[2]}; "
            f"use {use} trained for this target"
        )


class DrafterModule(nn.Module):
    """dtype, device, KV cache and RoPE of a drafter module; a subclass names `placed_by` and sets `rotary`."""

    placed_by: str  # the submodule whose weight has the module's dtype and device
    cache_layers = 1  # decoder layers in its KV cache
    rotary = None  # its RotaryTables (models/transformer.py), set by the subclass
    lean = None  # runtime/drafter_modules.use_lean_step sets it: its passes in native calls

    def native(self, rows: int | None = None) -> bool:
        """Whether an inference pass runs natively: runtime/drafter_modules.use_lean_step took, autograd is off
        (training keeps PyTorch's path), and the pass has at most the lean step's rows (longer ones, a prompt's, run
        faster in PyTorch)."""
        return self.lean is not None and not torch.is_grad_enabled() and (rows is None or rows <= self.lean.max_rows)

    @property
    def dtype(self) -> torch.dtype:
        return getattr(self, self.placed_by).weight.dtype

    @property
    def device(self) -> torch.device:
        return getattr(self, self.placed_by).weight.device

    def new_cache(self, capacity: int) -> KVCache:
        c = self.config
        return KVCache(self.cache_layers, c.num_key_value_heads, c.head_dim, capacity, self.dtype, self.device)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [.., 1, T, D] in the module's dtype for positions [T] or [B, T]."""
        positions = positions.to(self.device)  # the tables are made where the positions are
        cos, sin = self.rotary(positions, int(positions.max()), self.dtype)
        return (cos[None, None], sin[None, None]) if positions.dim() == 1 else (cos[:, None], sin[:, None])
