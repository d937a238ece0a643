"""The protocol every drafter implements. Drafters propose; they never verify."""

from __future__ import annotations

from typing import Protocol

import torch

from foretell.types import Proposal, SamplingParams


class Drafter(Protocol):
    """Optional attributes the engine reads: `max_nodes` (largest proposal, to size the caches;
    default the engine's max_draft) and `sizes_itself` (True: the drafter picks its own depth
    and the engine's length policy does not apply)."""

    name: str

    def start(self, prompt_ids: list[int], capacity: int, params: SamplingParams, generator: torch.Generator) -> None:
        """Begin a new generation. capacity bounds the sequence length (prompt + new + drafts)."""

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        """Propose up to max_tokens continuing `tokens` (every committed token so far)."""


def empty_proposal(device: torch.device | str = "cpu") -> Proposal:
    return Proposal(tokens=torch.empty(0, dtype=torch.long, device=device))
