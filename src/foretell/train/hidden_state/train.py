"""The training step of a hidden-state draft on cached target features (losses in loss.py).

The loop is common/feature_loop.py (trainer.py's schedule, data order and checkpoints); a step
backpropagates one sequence at a time (bounded memory). Only the draft's own parameters train:
its layer, norm and token-info W_1, W_2. The target's embedding and output layer are shared, frozen, and receive no gradient.
Everything a step depends on is a function of (seed, step) or in the checkpoint, so a resumed
run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from foretell.models.hidden_draft import HiddenDraft
from foretell.train.common.data import TokenData
from foretell.train.common.depths import anchor_seed
from foretell.train.common.feature_loop import run_steps
from foretell.train.common.features import FeatureCache
from foretell.train.common.distributed import DistContext
from foretell.train.common.trainer import TrainConfig
from foretell.train.hidden_state.loss import (
    HiddenLossConfig, kl_anchors, kl_pairs, mse_pairs, sequence_terms, unroll_steps, vocab_columns,
)

NOISE_STREAM = 0x5EED  # the noise generator's seed differs from the anchors' for the same (seed, step, sequence)


def top1_of(cache: FeatureCache, sequence: int) -> torch.Tensor:
    """[T] long: the target's greedy token after each position of a cached sequence."""
    return torch.from_numpy(np.asarray(cache.ids[sequence][:, 0]).astype(np.int64))


def hidden_step(draft: HiddenDraft, cache: FeatureCache, data: TokenData, index: torch.Tensor, mine: list[int],
                step: int, train: TrainConfig, cfg: HiddenLossConfig, depth: int) -> dict:
    """The backward of this process's share `mine` (positions in the global batch `index`), one sequence at a
    time, each term divided by the whole batch's totals; returns additive statistics."""
    k = unroll_steps(step, train.steps, depth, cfg.curriculum)
    anchors = [kl_anchors(data.loss_mask[i], cfg, train.seed, step, i) for i in index.tolist()]
    mse_total = sum(int(mse_pairs(data.loss_mask[i], a, k, cfg).sum()) for i, a in zip(index.tolist(), anchors))
    columns = vocab_columns(draft)
    kl_total = sum(int(kl_pairs(data.loss_mask[i], a, k, top1_of(cache, i), columns).sum())
                   for i, a in zip(index.tolist(), anchors))
    sums = {"loss": 0.0, "mse": 0.0, "kl": 0.0}
    agree, count = torch.zeros(k), torch.zeros(k)
    for pos in mine:
        i, a = int(index[pos]), anchors[pos]
        if len(a) == 0:
            continue
        hidden, logp, ids = cache.sequence(i)
        noise = torch.Generator().manual_seed(anchor_seed(train.seed, step, i) ^ NOISE_STREAM)
        with torch.autocast(draft.device.type, torch.bfloat16, enabled=train.bf16):
            t = sequence_terms(draft, hidden, logp, ids, data.input_ids[i], data.loss_mask[i], k, a, cfg, noise)
            mse = (t.mse * t.mse_valid.to(t.mse.device)).sum() / max(mse_total, 1)
            kl = (t.kl * t.kl_valid.to(t.kl.device)).sum() / max(kl_total, 1)
            loss = cfg.mse_weight * mse + cfg.kl_weight * kl
        loss.backward()
        for key, value in (("loss", loss), ("mse", mse), ("kl", kl)):
            sums[key] += value.item()
        agree += (t.agree & t.kl_valid).sum(0)
        count += t.kl_valid.sum(0)
    return {**sums, "agree": agree, "count": count}


def hidden_row(sums: dict, k: int) -> dict:
    """The log row's fields from the step's statistics summed over the processes (k: the unrolled steps)."""
    top1 = {f"top1_{d + 1}": round(float(sums["agree"][d] / max(sums["count"][d], 1)), 4) for d in range(k)}
    return {**{key: round(sums[key], 6) for key in ("loss", "mse", "kl")}, **top1, "unroll": k}


def train_hidden(draft: HiddenDraft, cache: FeatureCache, data: TokenData, train: TrainConfig, cfg: HiddenLossConfig,
                 depth: int, out: Path, resume: bool = True, stop_after: int | None = None,
                 ctx: DistContext | None = None) -> int:
    """Train `draft` in place, checkpointing into `out`; returns the steps done (train.steps unless stopped)."""

    def local_step(step: int, index: torch.Tensor, mine: list[int]) -> dict:
        return hidden_step(draft, cache, data, index, mine, step, train, cfg, depth)

    def summarize(sums: dict, step: int) -> dict:
        return hidden_row(sums, unroll_steps(step, train.steps, depth, cfg.curriculum))

    return run_steps(draft, local_step, summarize, train, len(data), out, resume, stop_after, "hidden-state draft",
                     lambda row: {"loss": f"{row['loss']:.4f}", "mse": f"{row['mse']:.3f}", "top1": f"{row['top1_1']:.2f}",
                                  "k": row["unroll"]}, ctx)
