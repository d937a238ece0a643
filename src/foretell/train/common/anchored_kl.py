"""The training step the anchor-trained heads share (parallel head, EAGLE-3) and its log row.

Each sequence of the global batch gets anchors sampled as a pure function of (seed, step, sequence), so a
resumed or data-parallel run repeats the single-process one. A head scores C columns per anchor (depths, or
unrolled steps): the KL of each valid (anchor, column) pair is weighted by its column and divided by the
whole batch's weight, so the processes' gradients sum to the gradient of the batch's weighted mean.
"""

from __future__ import annotations

from typing import Callable

import torch

from foretell.train.common.data import TokenData
from foretell.train.common.depths import anchor_seed, sample_anchors

# (sequence, anchors [A]) -> KL [A, C], valid [A, C] bool and top-1 agreement with the target [A, C] bool
Terms = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def batch_anchors(data: TokenData, count: int, seed: int, step: int, index: torch.Tensor) -> list[torch.Tensor]:
    """Up to `count` anchors of each sequence in the global batch `index` (fewer if it has fewer)."""
    return [sample_anchors(data.loss_mask[i], count, anchor_seed(seed, step, int(i))) for i in index]


def weighted_kl_backward(module: torch.nn.Module, index: torch.Tensor, mine: list[int], anchors: list[torch.Tensor],
                         weights: torch.Tensor, valid: Callable[[int, torch.Tensor], torch.Tensor], terms: Terms,
                         bf16: bool) -> dict:
    """The backward of this process's share `mine` (positions in the global batch `index`), one sequence at a
    time (bounded memory). valid(sequence, anchors) -> [A, C] the pairs trained; weights [C]. Returns additive
    statistics: the loss, and per column the KL sum, top-1 agreements and valid pairs."""
    total = sum(float((valid(int(i), a) * weights).sum()) for i, a in zip(index, anchors) if len(a))
    kl_sum, agree_sum, count = torch.zeros(len(weights)), torch.zeros(len(weights)), torch.zeros(len(weights))
    loss_value = 0.0
    for pos in mine:
        i, a = int(index[pos]), anchors[pos]
        if len(a) == 0:
            continue
        with torch.autocast(module.device.type, torch.bfloat16, enabled=bf16):
            kl, ok, agree = terms(i, a)
            loss = (kl * ok.to(kl.device) * weights.to(kl.device)).sum() / max(total, 1e-9)  # the step's weighted mean
        loss.backward()
        loss_value += loss.item()
        kl_sum += (kl.detach().float().cpu() * ok).sum(0)
        agree_sum += (agree & ok).sum(0)
        count += ok.sum(0)
    return {"loss": loss_value, "kl": kl_sum, "agree": agree_sum, "count": count}


def per_column_row(sums: dict) -> dict:
    """The log row's loss, and each column's mean KL and top-1 agreement, from the statistics summed over the
    processes."""
    per = sums["count"].clamp(min=1)
    columns = range(len(per))
    return {"loss": sums["loss"], **{f"kl{j + 1}": round(float(sums["kl"][j] / per[j]), 5) for j in columns},
            **{f"top1_{j + 1}": round(float(sums["agree"][j] / per[j]), 4) for j in columns}}


def loss_and_top1(row: dict) -> dict:
    """The progress bar's fields."""
    return {"loss": f"{row['loss']:.4f}", "top1": f"{row['top1_1']:.2f}"}
