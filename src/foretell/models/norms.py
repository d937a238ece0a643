"""The RMSNorms of the supported families: plain (Llama, Qwen, Phi) and Gemma's, which scales by (offset + weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foretell.models.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as the reference implementation does, then scale in the model dtype.
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight

    def scale(self) -> torch.Tensor:
        """The effective per-channel scale: what a plain RMSNorm's weight would be (a drafter's own norm starts as it)."""
        return self.weight


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: scale by (offset + weight), multiplied in fp32 before the cast (weights start at 0)."""

    def __init__(self, dim: int, eps: float, offset: float):
        super().__init__(dim, eps)
        self.offset = offset
        nn.init.zeros_(self.weight)  # scale 1 until weights load (a drafter's own norms start there)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float() + self.offset, self.eps).to(x.dtype)

    def scale(self) -> torch.Tensor:
        return self.weight + self.offset


def make_norm(cfg: ModelConfig, dim: int) -> RMSNorm:
    return OffsetRMSNorm(dim, cfg.rms_norm_eps, cfg.norm_offset) if cfg.norm_offset else RMSNorm(dim, cfg.rms_norm_eps)
