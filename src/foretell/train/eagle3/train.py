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
from foretell.train.common.data import TokenData
from foretell.train.common.depths import anchor_seed, sample_anchors
from foretell.train.common.distributed import DistContext
from foretell.train.common.feature_loop import run_steps
from foretell.train.common.features import FeatureCache
from foretell.train.common.trainer import TrainConfig
from foretell.train.eagle3.loss import Eagle3LossConfig, column_map, sequence_terms, valid_pairs


def eagle3_step(head: Eagle3Head, cache: FeatureCache, data: TokenData, index: torch.Tensor, mine: list[int],
                step: int, train: TrainConfig, cfg: Eagle3LossConfig, columns: torch.Tensor) -> dict:
    """The backward of this process's share `mine` (positions in the global batch `index`), each term divided
    by the whole batch's weight; returns additive statistics."""
    K = cfg.ttt_steps
    weights = cfg.step_weights()
    anchors = [sample_anchors(data.loss_mask[i], cfg.anchors, anchor_seed(train.seed, step, int(i))) for i in index]
    total = sum(float((valid_pairs(cache, data, int(i), a, K, columns) * weights).sum())
                for i, a in zip(index, anchors) if len(a))
    kl_sum, agree_sum, count = torch.zeros(K), torch.zeros(K), torch.zeros(K)
    loss_value = 0.0
    for pos in mine:
        i, a = int(index[pos]), anchors[pos]
        if len(a) == 0:
            continue
        with torch.autocast(head.device.type, torch.bfloat16, enabled=train.bf16):
            kl, valid, agree = sequence_terms(head, cache, data, i, a, K, columns)
            loss = (kl * valid.to(kl.device) * weights.to(kl.device)).sum() / max(total, 1e-9)
        loss.backward()
        loss_value += loss.item()
        kl_sum += (kl.detach().float().cpu() * valid).sum(0)
        agree_sum += (agree & valid).sum(0)
        count += valid.sum(0)
    return {"loss": loss_value, "kl": kl_sum, "agree": agree_sum, "count": count}


def eagle3_row(sums: dict, step: int) -> dict:
    """The log row's fields from the step's statistics summed over the processes."""
    per = sums["count"].clamp(min=1)
    K = len(per)
    return {"loss": sums["loss"], **{f"kl{j + 1}": round(float(sums["kl"][j] / per[j]), 5) for j in range(K)},
            **{f"top1_{j + 1}": round(float(sums["agree"][j] / per[j]), 4) for j in range(K)},
            "pairs": int(sums["count"].sum())}


def train_eagle3(head: Eagle3Head, cache: FeatureCache, data: TokenData, train: TrainConfig, cfg: Eagle3LossConfig,
                 out: Path, resume: bool = True, stop_after: int | None = None, ctx: DistContext | None = None) -> int:
    """Train `head` in place, checkpointing into `out`; returns the steps done (train.steps unless stopped)."""
    columns = column_map(head)

    def local_step(step: int, index: torch.Tensor, mine: list[int]) -> dict:
        return eagle3_step(head, cache, data, index, mine, step, train, cfg, columns)

    return run_steps(head, local_step, eagle3_row, train, len(data), out, resume, stop_after, "eagle3 head",
                     lambda row: {"loss": f"{row['loss']:.4f}", "top1": f"{row['top1_1']:.2f}"}, ctx)
