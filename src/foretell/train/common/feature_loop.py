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

import time
from pathlib import Path

import torch

from foretell.train.common.distributed import DistContext
from foretell.train.common.trainer import TrainConfig, TrainingRun, step_indices


def run_steps(module: torch.nn.Module, local_step, summarize, train: TrainConfig, num_sequences: int, out: Path,
              resume: bool, stop_after: int | None, desc: str, postfix, ctx: DistContext | None = None) -> int:
    """Train `module` in place: AdamW on its parameters, trainer.py's warmup + cosine, checkpoints and log in
    `out`. local_step(step, index, mine) runs the backward of this process's share of the global batch `index`
    (mine: positions in it) and returns additive statistics (floats or tensors, summed over the processes);
    summarize(sums, step) -> the log row's fields; postfix(row) -> the progress bar's. Returns the steps done."""
    ctx = ctx or DistContext()
    train.micro_batches(ctx.world_size)  # the global batch splits evenly over the processes
    module.requires_grad_(True).train()
    run = TrainingRun(module, train, out, ctx, resume, stop_after, desc)
    for step in run.steps():
        t0 = time.perf_counter()
        index = step_indices(step, train, num_sequences)
        run.optimizer.zero_grad(set_to_none=True)
        mine = ctx.shard(torch.arange(len(index))).tolist()  # positions: a batch may hold a sequence twice
        sums = ctx.sum_values(local_step(step, index, mine))
        ctx.sum_gradients(module.parameters())
        row = {"step": step + 1, **summarize(sums, step), **run.optimizer_step(),
               "seconds": round(time.perf_counter() - t0, 4)}
        run.record(row, postfix(row))
    return run.finish()
