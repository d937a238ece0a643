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

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from foretell.errors import ForetellError
from foretell.hot_vocab import hot_vocab_from_counts
from foretell.models.eagle3 import Eagle3Head
from foretell.train.common.data import TokenData
from foretell.train.common.depths import valid_depths
from foretell.train.common.features import FeatureCache
from foretell.train.common.topk import coarsened_kl

MASKED = -1e4  # log q of dropped top-k slots: finite, so gradients stay finite, and exp() of it is 0


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


def draft_vocabulary(data: TokenData, size: int, vocab_size: int, special_ids=()) -> torch.Tensor:
    """The `size` target tokens drafted most often in the training data (the tokens after every trained
    position), special tokens first (end-of-turn must stay draftable); ascending ids."""
    drafted = data.input_ids[:, 1:][data.loss_mask[:, :-1]]
    counts = Counter(drafted.tolist())
    for special in special_ids:
        counts[special] += 10**9
    return hot_vocab_from_counts(counts, size, vocab_size).ids


def columns_of(vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size] long: each target id's column in a draft vocabulary `vocab_ids`, -1 outside it."""
    columns = torch.full((vocab_size,), -1, dtype=torch.long)
    columns[vocab_ids.cpu()] = torch.arange(len(vocab_ids))
    return columns


def column_map(head: Eagle3Head) -> torch.Tensor:
    """[vocab_size] long: each target id's draft column, -1 outside the draft vocabulary."""
    return columns_of(head.vocab_ids, head.config.vocab_size)


def draft_vocab_kl(logits: torch.Tensor, logp: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Per-position KL(p' || q) [...]: q = softmax(logits [..., V_draft]); p' = the target's top-k (log-probs
    logp [..., k] at draft columns `columns` [..., k], -1 = outside the draft vocabulary) with the outside
    entries dropped and the rest, tail included, renormalised. As common/topk.py, the divergence between p'
    and q coarsened to the kept entries plus one tail bucket."""
    keep = columns >= 0
    p = logp.exp()
    z = (1.0 - (p * ~keep).sum(-1)).clamp(min=1e-12)  # p's mass left once the outside entries are dropped
    p_kept = torch.where(keep, p / z[..., None], torch.zeros_like(p))
    logp_kept = torch.where(keep, logp - z.log()[..., None], torch.zeros_like(logp))
    log_q = F.log_softmax(logits.float(), dim=-1)
    log_q_top = torch.where(keep, log_q.gather(-1, columns.clamp(min=0)), torch.full_like(logp, MASKED))
    return coarsened_kl(p_kept, logp_kept, log_q_top)


def valid_pairs(cache: FeatureCache, data: TokenData, sequence: int, anchors: torch.Tensor, steps: int,
                columns: torch.Tensor) -> torch.Tensor:
    """[A, steps] bool: trained (anchor, step) pairs: an assistant token whose target top-1 is in the draft vocabulary."""
    top1 = torch.from_numpy(np.asarray(cache.ids[sequence][:, 0]).astype(np.int64))
    at = (anchors[:, None] + torch.arange(1, steps + 1)).clamp(max=len(top1) - 1)
    return valid_depths(data.loss_mask[sequence], anchors, steps) & (columns[top1[at]] >= 0)


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
    return kl, valid_pairs(cache, data, sequence, anchors, steps, columns), agree
