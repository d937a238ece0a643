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
from foretell.train.common.data import TokenData
from foretell.train.common.depths import anchor_seed, sample_anchors, valid_depths
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


def sequence_terms(head: ParallelHead, cache: FeatureCache, data: TokenData, sequence: int,
                   anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL [A, D], valid [A, D] and top-1 agreement [A, D] of one sequence at its anchors."""
    D = head.config.depth
    features, logp, ids = cache.sequence(sequence)
    tokens = data.input_ids[sequence]
    rows = int(anchors.max()) + 1  # context rows past the last anchor are never seen: crop them
    logits = head.forward_training(features[None, :rows].to(head.device), tokens[None, 1 : rows + 1].to(head.device),
                                   anchors.tolist())[0]
    at = (anchors[:, None] + torch.arange(1, D + 1)).clamp(max=len(tokens) - 1)  # p's row for each (a, d)
    kl = topk_kl(logits, logp[at].to(logits.device), ids[at].to(logits.device))
    agree = logits.detach().argmax(-1).cpu() == ids[at][..., 0]
    return kl, valid_depths(data.loss_mask[sequence], anchors, D), agree


def head_step(head: ParallelHead, cache: FeatureCache, data: TokenData, index: torch.Tensor, mine: list[int],
              step: int, train: TrainConfig, loss_cfg: HeadLossConfig) -> dict:
    """The backward of this process's share `mine` (positions in the global batch `index`), one sequence at a
    time (bounded memory), each term divided by the whole batch's weight; returns additive statistics."""
    D = head.config.depth
    weights = loss_cfg.depth_weights(D)
    anchors = [sample_anchors(data.loss_mask[i], loss_cfg.anchors, anchor_seed(train.seed, step, int(i))) for i in index]
    total = sum(float((valid_depths(data.loss_mask[i], a, D) * weights).sum()) for i, a in zip(index, anchors))
    kl_sum, agree_sum, count = torch.zeros(D), torch.zeros(D), torch.zeros(D)
    loss_value = 0.0
    for pos in mine:
        i, a = int(index[pos]), anchors[pos]
        if len(a) == 0:
            continue
        with torch.autocast(head.device.type, torch.bfloat16, enabled=train.bf16):
            kl, valid, agree = sequence_terms(head, cache, data, i, a)
            loss = (kl * valid.to(kl.device) * weights.to(kl.device)).sum() / max(total, 1e-9)  # the step's weighted mean
        loss.backward()
        loss_value += loss.item()
        kl_sum += (kl.detach().float().cpu() * valid).sum(0)
        agree_sum += (agree & valid).sum(0)
        count += valid.sum(0)
    return {"loss": loss_value, "kl": kl_sum, "agree": agree_sum, "count": count}


def head_row(sums: dict, step: int) -> dict:
    """The log row's fields from the step's statistics summed over the processes."""
    per = sums["count"].clamp(min=1)
    D = len(per)
    return {"loss": sums["loss"], **{f"kl{d + 1}": round(float(sums["kl"][d] / per[d]), 5) for d in range(D)},
            **{f"top1_{d + 1}": round(float(sums["agree"][d] / per[d]), 4) for d in range(D)},
            "anchors": int(sums["count"][0])}


def train_head(head: ParallelHead, cache: FeatureCache, data: TokenData, train: TrainConfig, loss_cfg: HeadLossConfig,
               out: Path, resume: bool = True, stop_after: int | None = None, ctx: DistContext | None = None) -> int:
    """Train `head` in place, checkpointing into `out`; returns the steps done (train.steps unless stopped)."""

    def local_step(step: int, index: torch.Tensor, mine: list[int]) -> dict:
        return head_step(head, cache, data, index, mine, step, train, loss_cfg)

    return run_steps(head, local_step, head_row, train, len(data), out, resume, stop_after, "parallel head",
                     lambda row: {"loss": f"{row['loss']:.4f}", "top1": f"{row['top1_1']:.2f}"}, ctx)
