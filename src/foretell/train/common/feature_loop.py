"""The resumable training loop of a drafter trained on cached target features (parallel head, hidden state).

It reuses trainer.py's schedule, checkpoints and log; only the step differs per drafter (a
drafter's forward takes features and anchors, not token ids), so each family passes its own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from foretell.train.common.trainer import (
    CHECKPOINT, LOG, TrainConfig, WarmupCosine, load_checkpoint, plot_losses, save_checkpoint, truncate_log,
)


def run_steps(module: torch.nn.Module, step_fn, train: TrainConfig, out: Path, resume: bool, stop_after: int | None,
              desc: str, postfix) -> int:
    """Train `module` in place: AdamW on its parameters, trainer.py's warmup + cosine, checkpoints and log
    in `out`. step_fn(optimizer, scheduler, step) does one optimizer step and returns its log row;
    postfix(row) -> the progress bar's fields. Returns the steps done."""
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
