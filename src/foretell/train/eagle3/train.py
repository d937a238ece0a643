"""The training step of an EAGLE-3 head on cached target features (the loss is in loss.py).

The loop is common/feature_loop.py (trainer.py's schedule, data order and checkpoints, data-parallel over
processes); a step backpropagates one sequence at a time. Only the head's own parameters train (fc, the
midlayer, the final norm and its lm_head); the target's embedding is shared and frozen, and the draft
vocabulary's id maps are buffers, fixed before training.
"""

from __future__ import annotations

from pathlib import Path

import torch

from foretell.models.eagle3 import Eagle3Head
from foretell.train.common.anchored_kl import batch_anchors, loss_and_top1, per_column_row, weighted_kl_backward
from foretell.train.common.data import TokenData
from foretell.train.common.distributed import DistContext
from foretell.train.common.feature_loop import run_steps
from foretell.train.common.features import FeatureCache
from foretell.train.common.trainer import TrainConfig
from foretell.train.common.draft_vocab import trained_pairs
from foretell.train.eagle3.loss import Eagle3LossConfig, column_map, sequence_terms


def eagle3_step(head: Eagle3Head, cache: FeatureCache, data: TokenData, index: torch.Tensor, mine: list[int],
                step: int, train: TrainConfig, cfg: Eagle3LossConfig, columns: torch.Tensor) -> dict:
    """The backward of this process's share `mine` (positions in the global batch `index`): the unrolled steps
    are the columns, step j weighted step_decay ** j; returns additive statistics."""
    K = cfg.ttt_steps
    anchors = batch_anchors(data, cfg.anchors, train.seed, step, index)
    return weighted_kl_backward(head, index, mine, anchors, cfg.step_weights(),
                                lambda i, a: trained_pairs(cache, data, i, a, K, columns),
                                lambda i, a: sequence_terms(head, cache, data, i, a, K, columns), train.bf16)


def eagle3_row(sums: dict, step: int) -> dict:
    """The log row's fields from the step's statistics summed over the processes."""
    return {**per_column_row(sums), "pairs": int(sums["count"].sum())}


def train_eagle3(head: Eagle3Head, cache: FeatureCache, data: TokenData, train: TrainConfig, cfg: Eagle3LossConfig,
                 out: Path, resume: bool = True, stop_after: int | None = None, ctx: DistContext | None = None) -> int:
    """Train `head` in place, checkpointing into `out`; returns the steps done (train.steps unless stopped)."""
    columns = column_map(head)

    def local_step(step: int, index: torch.Tensor, mine: list[int]) -> dict:
        return eagle3_step(head, cache, data, index, mine, step, train, cfg, columns)

    return run_steps(head, local_step, eagle3_row, train, len(data), out, resume, stop_after, "eagle3 head",
                     loss_and_top1, ctx)
