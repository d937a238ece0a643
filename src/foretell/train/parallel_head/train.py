"""Training a parallel draft head on cached target features: all depths at sampled anchors.

For a training sequence, anchor a is a context row: the head has seen the target's rows 0..a
and the tokens 1..a+1, and its depth-d distribution q_d should match the target's p at position
a + d (the distribution of token a + d + 1, given the true prefix). The loss is KL(p || q_d) from
p's cached top-k (common/topk.py), averaged over the valid (anchor, depth) pairs with weight
decay^(d - 1): shallow depths matter most, since a deep draft token is only reached when every
token before it is accepted.

The loop is common/feature_loop.py (trainer.py's schedule, data order and checkpoints); anchors
come from common/depths.py, a pure function of (seed, step, sequence), so a resumed run repeats
the uninterrupted one exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from foretell.errors import ForetellError
from foretell.models.parallel_head import ParallelHead
from foretell.train.common.anchored_kl import batch_anchors, loss_and_top1, per_column_row, weighted_kl_backward
from foretell.train.common.data import TokenData
from foretell.train.common.draft_vocab import columns_of, draft_vocab_kl, trained_pairs
from foretell.train.common.feature_loop import run_steps
from foretell.train.common.features import FeatureCache
from foretell.train.common.topk import topk_kl
from foretell.train.common.distributed import DistContext
from foretell.train.common.trainer import TrainConfig


@dataclass(frozen=True)
class HeadLossConfig:
    anchors: int = 32  # anchors sampled per sequence and step (fewer if the sequence has fewer)
    depth_decay: float = 0.8  # depth d weighs depth_decay ** (d - 1)

    def __post_init__(self):
        if self.anchors < 1:
            raise ForetellError(f"--anchors must be >= 1, got {self.anchors}")
        if not 0.0 < self.depth_decay <= 1.0:
            raise ForetellError(f"--depth-decay must be in (0, 1], got {self.depth_decay}")

    def depth_weights(self, depth: int) -> torch.Tensor:
        return self.depth_decay ** torch.arange(depth, dtype=torch.float32)


def sequence_terms(head: ParallelHead, cache: FeatureCache, data: TokenData, sequence: int, anchors: torch.Tensor,
                   columns: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL [A, D], valid [A, D] and top-1 agreement [A, D] of one sequence at its anchors. columns: each target
    id's column in the head's own vocabulary (-1 outside it), or None when the head scores the whole vocabulary."""
    D = head.config.depth
    features, logp, ids = cache.sequence(sequence)
    tokens = data.input_ids[sequence]
    rows = int(anchors.max()) + 1  # context rows past the last anchor are never seen: crop them
    logits = head.forward_training(features[None, :rows].to(head.device), tokens[None, 1 : rows + 1].to(head.device),
                                   anchors.tolist(), full_vocab=columns is None)[0]
    at = (anchors[:, None] + torch.arange(1, D + 1)).clamp(max=len(tokens) - 1)  # p's row for each (a, d)
    drafted = logits.detach().argmax(-1).cpu()
    if columns is None:
        kl = topk_kl(logits, logp[at].to(logits.device), ids[at].to(logits.device))
    else:  # KL to p restricted to the head's vocabulary (as EAGLE-3 trains)
        kl = draft_vocab_kl(logits, logp[at].to(logits.device), columns[ids[at]].to(logits.device))
        drafted = head.vocab_ids.cpu()[drafted]
    return kl, trained_pairs(cache, data, sequence, anchors, D, columns), drafted == ids[at][..., 0]


def head_step(head: ParallelHead, cache: FeatureCache, data: TokenData, index: torch.Tensor, mine: list[int],
              step: int, train: TrainConfig, loss_cfg: HeadLossConfig) -> dict:
    """The backward of this process's share `mine` (positions in the global batch `index`): the depths are the
    columns; returns additive statistics."""
    D = head.config.depth
    anchors = batch_anchors(data, loss_cfg.anchors, train.seed, step, index)
    columns = columns_of(head.vocab_ids, head.config.vocab_size) if head.config.draft_vocab_size else None
    return weighted_kl_backward(head, index, mine, anchors, loss_cfg.depth_weights(D),
                                lambda i, a: trained_pairs(cache, data, i, a, D, columns),
                                lambda i, a: sequence_terms(head, cache, data, i, a, columns), train.bf16)


def head_row(sums: dict, step: int) -> dict:
    """The log row's fields from the step's statistics summed over the processes."""
    return {**per_column_row(sums), "anchors": int(sums["count"][0])}


def train_head(head: ParallelHead, cache: FeatureCache, data: TokenData, train: TrainConfig, loss_cfg: HeadLossConfig,
               out: Path, resume: bool = True, stop_after: int | None = None, ctx: DistContext | None = None) -> int:
    """Train `head` in place, checkpointing into `out`; returns the steps done (train.steps unless stopped)."""

    def local_step(step: int, index: torch.Tensor, mine: list[int]) -> dict:
        return head_step(head, cache, data, index, mine, step, train, loss_cfg)

    return run_steps(head, local_step, head_row, train, len(data), out, resume, stop_after, "parallel head",
                     loss_and_top1, ctx)
