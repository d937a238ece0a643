"""Token-info injection ("Make Every Draft Count", arXiv 2602.21224):
E(t) = W_E[t] W_1 W_2, added to draft logits at sampling time.

W_E [V, H] is the target's frozen embedding, W_1 [H, r] and W_2 [r, V] are trainable and low
rank (r = 256 by default). The hidden-state draft never sees tokens; E(t) is how the token of a
tree node shapes the distribution of its children. E is computed row by row from the factors
(an [r]-vector per token, then one [r] x [r, V] product), so the |V| x |V| matrix W_E W_1 W_2
is never formed. A table of precomputed rows for chosen (hot) tokens is optional: it trades
memory (rows x output size x 4 bytes, reported by `nbytes`) for one small matmul per node.
"""

from __future__ import annotations

import time

import torch
from torch import nn


class TokenInfo(nn.Module):
    """The trainable factors: `down` holds W_1 (as an nn.Linear weight, W_1^T [r, H]), `up` W_2 ([V, r])."""

    def __init__(self, hidden_size: int, rank: int, vocab_size: int):
        super().__init__()
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, vocab_size, bias=False)
        # Zero W_2, as LoRA zeroes its up factor: an untrained E is 0 and changes nothing, and
        # gradients still reach both factors (through W_2 first).
        nn.init.zeros_(self.up.weight)
        self._hot_key: tuple | None = None
        self._hot_up: torch.Tensor | None = None

    def forward(self, embedded: torch.Tensor) -> torch.Tensor:
        """[..., H] target embeddings -> [..., V] float32 logit offsets over the full vocabulary."""
        return self.up(self.down(embedded.to(self.down.weight.dtype))).float()

    def hot_forward(self, embedded: torch.Tensor, hot_ids: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., H_hot] offsets for the hot ids only (the hot rows of W_2, cached)."""
        w = self.up.weight
        # Rebuild the hot copy whenever W_2 changed in place (load, optimiser step): _version counts those.
        key = (w.data_ptr(), w._version, hot_ids.data_ptr(), hot_ids.numel())
        if key != self._hot_key:
            self._hot_up = w.detach().index_select(0, hot_ids.to(w.device)).contiguous()
            self._hot_key = key
        z = self.down(embedded.to(self.down.weight.dtype))
        return torch.nn.functional.linear(z, self._hot_up).float()


class TokenInfoTable:
    """Precomputed E rows for a set of tokens; other tokens fall back to the factors.

    rows: [K, V_out] float32, row i = E(token_ids[i]) over the drafter's output space (the
    full vocabulary, or the hot ids). build_seconds: how long the precomputation took (the
    seed's "token-info load time" check).
    """

    def __init__(self, token_ids: list[int], rows: torch.Tensor, build_seconds: float):
        self.index = {t: i for i, t in enumerate(token_ids)}
        self.rows = rows
        self.build_seconds = build_seconds

    @classmethod
    def build(cls, token_ids: list[int], compute, chunk: int = 1024) -> "TokenInfoTable":
        """compute: list[int] -> [n, V_out] float32 (the drafter's E), run in chunks to bound memory peaks."""
        t0 = time.perf_counter()
        parts = [compute(token_ids[i : i + chunk]) for i in range(0, len(token_ids), chunk)]
        rows = torch.cat(parts) if parts else torch.empty(0, 0)
        return cls(list(token_ids), rows, time.perf_counter() - t0)

    def get(self, token: int) -> torch.Tensor | None:
        i = self.index.get(token)
        return None if i is None else self.rows[i]

    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()
