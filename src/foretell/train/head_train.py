"""Training a parallel draft head on cached target features: all depths at sampled anchors.

For a training sequence, anchor a is a context row: the head has seen the target's rows 0..a
and the tokens 1..a+1, and its depth-d distribution q_d should match the target's p at position
a + d (the distribution of token a + d + 1, given the true prefix). The loss is KL(p || q_d) from
p's cached top-k (losses.topk_kl), averaged over the valid (anchor, depth) pairs with weight
decay^(d - 1): shallow depths matter most, since a deep draft token is only reached when every
token before it is accepted.

The loop reuses trainer.py's schedule, data order and checkpoints; only the step differs (the
head's forward takes features and anchors, not token ids). Anchors are a pure function of
(seed, step, sequence), so a resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from foretell.errors import ForetellError
from foretell.models.parallel_head import ParallelHead
from foretell.train.data import TokenData
from foretell.train.head_features import FeatureCache
from foretell.train.losses import topk_kl
from foretell.train.trainer import (
    CHECKPOINT, LOG, TrainConfig, WarmupCosine, load_checkpoint, plot_losses, save_checkpoint, step_indices,
    truncate_log,
)


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


def valid_depths(loss_mask: torch.Tensor, anchors: torch.Tensor, depth: int) -> torch.Tensor:
    """[A, D] bool: depth d of anchor a is trained where token a + d + 1 is an assistant token."""
    at = anchors[:, None] + torch.arange(1, depth + 1)
    return loss_mask[at.clamp(max=len(loss_mask) - 1)] & (at < len(loss_mask))


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Context rows whose depth-1 token is trained (a context row needs its next token: a <= T - 2)."""
    return torch.nonzero(loss_mask[1:]).flatten()


def sample_anchors(loss_mask: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """Up to `count` distinct anchors, ascending, drawn by a generator seeded with `seed`."""
    candidates = anchor_candidates(loss_mask)
    if len(candidates) > count:
        pick = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))[:count]
        candidates = candidates[pick.sort().values]
    return candidates


def anchor_seed(seed: int, step: int, sequence: int) -> int:
    return (seed * 1_000_003 + step) * 1_000_033 + sequence


def sequence_terms(head: ParallelHead, cache: FeatureCache, data: TokenData, sequence: int,
                   anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL [A, D], valid [A, D] and top-1 agreement [A, D] of one sequence at its anchors."""
    D = head.config.depth
    features, logp, ids = cache.sequence(sequence)
    tokens = data.input_ids[sequence]
    rows = int(anchors.max()) + 1  # context rows past the last anchor are never seen: crop them
    logits = head.forward_training(features[None, :rows], tokens[None, 1 : rows + 1], anchors.tolist())[0]
    at = (anchors[:, None] + torch.arange(1, D + 1)).clamp(max=len(tokens) - 1)  # p's row for each (a, d)
    kl = topk_kl(logits, logp[at].to(logits.device), ids[at].to(logits.device))
    agree = logits.detach().argmax(-1).cpu() == ids[at][..., 0]
    return kl, valid_depths(data.loss_mask[sequence], anchors, D), agree


def head_step(head: ParallelHead, optimizer, scheduler, cache: FeatureCache, data: TokenData, index: torch.Tensor,
              step: int, train: TrainConfig, loss_cfg: HeadLossConfig) -> dict:
    """One optimizer step over the sequences `index`; backward one sequence at a time (bounded memory)."""
    D = head.config.depth
    weights = loss_cfg.depth_weights(D)
    anchors = [sample_anchors(data.loss_mask[i], loss_cfg.anchors, anchor_seed(train.seed, step, int(i))) for i in index]
    total = sum(float((valid_depths(data.loss_mask[i], a, D) * weights).sum()) for i, a in zip(index, anchors))
    optimizer.zero_grad(set_to_none=True)
    kl_sum, agree_sum, count = torch.zeros(D), torch.zeros(D), torch.zeros(D)
    loss_value = 0.0
    for i, a in zip(index.tolist(), anchors):
        if len(a) == 0:
            continue
        with torch.autocast(head.device.type, torch.bfloat16, enabled=train.bf16):
            kl, valid, agree = sequence_terms(head, cache, data, i, a)
            loss = (kl * valid * weights.to(kl.device)).sum() / max(total, 1e-9)  # the step's weighted mean
        loss.backward()
        loss_value += loss.item()
        kl_sum += (kl.detach().cpu() * valid).sum(0)
        agree_sum += (agree & valid).sum(0)
        count += valid.sum(0)
    grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), train.grad_clip)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    per = count.clamp(min=1)
    return {"loss": loss_value, **{f"kl{d + 1}": round(float(kl_sum[d] / per[d]), 5) for d in range(D)},
            **{f"top1_{d + 1}": round(float(agree_sum[d] / per[d]), 4) for d in range(D)},
            "grad_norm": float(grad_norm), "lr": lr, "anchors": int(count[0])}


def train_head(head: ParallelHead, cache: FeatureCache, data: TokenData, train: TrainConfig, loss_cfg: HeadLossConfig,
               out: Path, resume: bool = True, stop_after: int | None = None) -> int:
    """Train `head` in place, checkpointing into `out`; returns the steps done (train.steps unless stopped)."""

    def step_fn(optimizer, scheduler, step: int) -> dict:
        index = step_indices(step, train, len(data))
        return head_step(head, optimizer, scheduler, cache, data, index, step, train, loss_cfg)

    return run_steps(head, step_fn, train, out, resume, stop_after, "parallel head",
                     lambda row: {"loss": f"{row['loss']:.4f}", "top1": f"{row['top1_1']:.2f}"})


def run_steps(module: torch.nn.Module, step_fn, train: TrainConfig, out: Path, resume: bool, stop_after: int | None,
              desc: str, postfix) -> int:
    """The resumable loop of a drafter trained on cached features: AdamW on module's parameters, trainer.py's
    warmup + cosine, checkpoints and log in `out`. step_fn(optimizer, scheduler, step) does one optimizer step and
    returns its log row; postfix(row) -> the progress bar's fields. Returns the steps done."""
    module.requires_grad_(True).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    warmup = train.warmup_steps if train.warmup_steps is not None else max(1, train.steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup, train.steps, train.min_lr_ratio))
    out.mkdir(parents=True, exist_ok=True)
    ckpt, log_path = out / CHECKPOINT, out / LOG
    start = load_checkpoint(ckpt, module, optimizer, scheduler, train) if resume and ckpt.is_file() else 0
    truncate_log(log_path, start)
    end = min(train.steps, stop_after) if stop_after is not None else train.steps
    bar = tqdm(range(start, end), initial=start, total=train.steps, desc=desc)
    for step in bar:
        t0 = time.perf_counter()
        row = {"step": step + 1, **step_fn(optimizer, scheduler, step), "seconds": round(time.perf_counter() - t0, 4)}
        with open(log_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        bar.set_postfix(**postfix(row))
        if (step + 1) % train.checkpoint_every == 0 or step + 1 == end:
            save_checkpoint(ckpt, module, optimizer, scheduler, step + 1, train)
    bar.close()
    if log_path.is_file() and log_path.stat().st_size:
        plot_losses(log_path, out / "loss.png", desc)
    module.eval().requires_grad_(False)
    return end
