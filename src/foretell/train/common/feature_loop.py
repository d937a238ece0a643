"""The resumable training loop of a drafter trained on cached target features (parallel head, hidden state,
EAGLE-3), data-parallel over the processes of a DistContext.

It reuses trainer.py's schedule, data order, checkpoints and log; only the step differs per drafter (a
drafter's forward takes features and anchors, not token ids), so each family passes its own. Each process
runs the sequences of the global batch that are its share (ctx.shard) and divides every loss term by the
global batch's total weight; summing the gradients over the processes then gives exactly the gradient one
process computes over the whole batch (up to the order of float additions), and every process takes the
same optimizer step. The main process writes the log and the checkpoints.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from foretell.train.common.distributed import DistContext
from foretell.train.common.trainer import (
    CHECKPOINT, LOG, TrainConfig, WarmupCosine, load_checkpoint, plot_losses, save_checkpoint, step_indices,
    truncate_log,
)


def run_steps(module: torch.nn.Module, local_step, summarize, train: TrainConfig, num_sequences: int, out: Path,
              resume: bool, stop_after: int | None, desc: str, postfix, ctx: DistContext | None = None) -> int:
    """Train `module` in place: AdamW on its parameters, trainer.py's warmup + cosine, checkpoints and log in
    `out`. local_step(step, index, mine) runs the backward of this process's share of the global batch `index`
    (mine: positions in it) and returns additive statistics (floats or tensors, summed over the processes);
    summarize(sums, step) -> the log row's fields; postfix(row) -> the progress bar's. Returns the steps done."""
    ctx = ctx or DistContext()
    train.micro_batches(ctx.world_size)  # the global batch splits evenly over the processes
    module.requires_grad_(True).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    warmup = train.warmup_steps if train.warmup_steps is not None else max(1, train.steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup, train.steps, train.min_lr_ratio))
    out.mkdir(parents=True, exist_ok=True)
    ckpt, log_path = out / CHECKPOINT, out / LOG
    start = load_checkpoint(ckpt, module, optimizer, scheduler, train) if resume and ckpt.is_file() else 0
    if ctx.is_main:
        truncate_log(log_path, start)
    end = min(train.steps, stop_after) if stop_after is not None else train.steps
    bar = tqdm(range(start, end), initial=start, total=train.steps, desc=desc, disable=not ctx.is_main)
    for step in bar:
        t0 = time.perf_counter()
        index = step_indices(step, train, num_sequences)
        optimizer.zero_grad(set_to_none=True)
        mine = ctx.shard(torch.arange(len(index))).tolist()  # positions: a batch may hold a sequence twice
        sums = ctx.sum_values(local_step(step, index, mine))
        ctx.sum_gradients(module.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(module.parameters(), train.grad_clip)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        row = {"step": step + 1, **summarize(sums, step), "grad_norm": float(grad_norm), "lr": lr,
               "seconds": round(time.perf_counter() - t0, 4)}
        if ctx.is_main:
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            bar.set_postfix(**postfix(row))
        if (step + 1) % train.checkpoint_every == 0 or step + 1 == end:
            if ctx.is_main:
                save_checkpoint(ckpt, module, optimizer, scheduler, step + 1, train)
            ctx.barrier()
    bar.close()
    if ctx.is_main and log_path.is_file() and log_path.stat().st_size:
        plot_losses(log_path, out / "loss.png", desc)
    module.eval().requires_grad_(False)
    return end
