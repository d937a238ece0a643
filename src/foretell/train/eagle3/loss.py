"""The loss of EAGLE-3 head training on cached target features: the training-time test (TTT).

Anchor a is a context row: the head has seen the target's rows 0..a and the tokens 1..a + 1. The head is
unrolled `ttt_steps` steps from every sampled anchor (models/eagle3.py forward_training): step j feeds the
true token a + 1 + j with step j - 1's output, under the masks inference uses (the context causally, then
the anchor's own earlier steps), so the head learns from its own imperfect states. Step j's distribution
is for token a + 2 + j, i.e. the target's p at position a + 1 + j.

Its loss is KL(p' || q_j), p' the target's distribution restricted to the draft vocabulary (the cached top-k
entries outside it dropped and the rest renormalised, the tail bucket kept) and q_j the head's over its draft
vocabulary, weighted step_decay ** j (EAGLE-3's 0.8) and averaged over the global batch. A pair is trained
where token a + 2 + j is an assistant token and the target's top-1 there is in the draft vocabulary (as
SpecForge masks positions whose target token the draft vocabulary cannot express). Anchors are a pure
function of (seed, step, sequence), so a resumed or data-parallel run repeats the single-process one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foretell.errors import ForetellError
from foretell.models.eagle3 import Eagle3Head
from foretell.train.common.data import TokenData
from foretell.train.common.draft_vocab import columns_of, draft_vocab_kl, trained_pairs
from foretell.train.common.features import FeatureCache


@dataclass(frozen=True)
class Eagle3LossConfig:
    ttt_steps: int = 3  # unrolled steps (EAGLE-3 unrolls 7 on GPUs)
    step_decay: float = 0.8  # step j weighs step_decay ** j
    anchors: int = 32  # anchors sampled per sequence and step

    def __post_init__(self):
        if self.ttt_steps < 1 or self.anchors < 1:
            raise ForetellError(f"--ttt-steps and --anchors must be >= 1, got {self.ttt_steps} and {self.anchors}")
        if not 0.0 < self.step_decay <= 1.0:
            raise ForetellError(f"--step-decay must be in (0, 1], got {self.step_decay}")

    def step_weights(self) -> torch.Tensor:
        return self.step_decay ** torch.arange(self.ttt_steps, dtype=torch.float32)


def column_map(head: Eagle3Head) -> torch.Tensor:
    """[vocab_size] long: each target id's draft column, -1 outside the draft vocabulary."""
    return columns_of(head.vocab_ids, head.config.vocab_size)


def sequence_terms(head: Eagle3Head, cache: FeatureCache, data: TokenData, sequence: int, anchors: torch.Tensor,
                   steps: int, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL [A, steps], valid [A, steps] and top-1 agreement with the target [A, steps] of one sequence."""
    features, logp, ids = cache.sequence(sequence)
    tokens = data.input_ids[sequence]
    rows = int(anchors.max()) + 1  # context rows past the last anchor are never seen: crop them
    states = head.forward_training(features[None, :rows], tokens[None].to(head.device), anchors, steps)[0]
    logits = head.logits(states)  # [A, steps, V_draft]
    at = (anchors[:, None] + torch.arange(1, steps + 1)).clamp(max=len(tokens) - 1)  # p's row of each pair
    kl = draft_vocab_kl(logits, logp[at].to(logits.device), columns[ids[at]].to(logits.device))
    agree = head.vocab_ids[logits.detach().argmax(-1)].cpu() == ids[at][..., 0]
    return kl, trained_pairs(cache, data, sequence, anchors, steps, columns), agree
