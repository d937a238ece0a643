"""The protocol every drafter implements. Drafters propose; they never verify."""

from __future__ import annotations

from typing import Protocol

import torch

from foretell.types import Proposal, SamplingParams


class Drafter(Protocol):
    """Optional attributes the engine reads: `max_nodes` (largest proposal, to size the caches;
    default the engine's max_draft) and `sizes_itself` (True: the drafter picks its own depth
    and the engine's length policy does not apply).

    Reading the target's hidden states: a drafter that declares `target_layers: tuple[int, ...]`
    (layer indices as in Transformer.forward's `hidden_layers`: 0 = embeddings, L = final norm)
    must also implement `observe(hidden: dict[int, torch.Tensor])`. The engine then requests
    those layers in the prefill and in every verification pass, and calls `observe` with the
    rows ([n, H] per layer) of the tokens just committed to the target's cache, in sequence
    order: after `start`, the prompt's rows (all of it but its last token; not called for a
    one-token prompt), and after each verification the root's row then the accepted drafts'
    rows (a tree: its accepted path). So before each `propose(tokens, ...)` the drafter has
    seen exactly the rows of tokens[:-1]. Drafters without `target_layers` cost nothing extra.
    """

    name: str

    def start(self, prompt_ids: list[int], capacity: int, params: SamplingParams, generator: torch.Generator) -> None:
        """Begin a new generation. capacity bounds the sequence length (prompt + new + drafts)."""

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        """Propose up to max_tokens continuing `tokens` (every committed token so far)."""


def empty_proposal(device: torch.device | str = "cpu") -> Proposal:
    return Proposal(tokens=torch.empty(0, dtype=torch.long, device=device))
