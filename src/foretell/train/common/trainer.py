"""A small, resumable training loop: AdamW, warmup + cosine, clipping, accumulation, optional bf16, DDP.

Determinism is the design constraint: which sequences a step sees is a pure function of
(seed, step), and a checkpoint holds everything else that changes (weights, optimizer moments,
scheduler, RNG), so a resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from foretell.errors import ForetellError
from foretell.models.transformer import Transformer
from foretell.train.common.distributed import DistContext

CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"

# objective(logits [b, T, V], batch) -> (loss, metrics); batches come from batch_fn(sequence indices [b]).
Objective = Callable[[torch.Tensor, dict], tuple[torch.Tensor, dict]]
BatchFn = Callable[[torch.Tensor], dict]


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 16  # sequences per optimizer step, all processes together
    micro_batch_size: int = 4  # sequences per forward/backward in one process
    lr: float = 3e-4  # AdaSPEC's learning rate
    warmup_steps: int | None = None  # None = 10% of the steps
    min_lr_ratio: float = 0.1  # cosine decay ends at lr / 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    bf16: bool = False  # autocast matmuls to bfloat16 (weights and optimizer stay float32)
    checkpoint_every: int = 100
    seed: int = 0

    def micro_batches(self, world_size: int) -> int:
        """Micro-batches per step on each process (the gradient accumulation count)."""
        per_step = self.micro_batch_size * world_size
        if self.batch_size % per_step:
            raise ForetellError(
                f"batch size {self.batch_size} must be a multiple of micro batch {self.micro_batch_size} x {world_size} processes"
            )
        return self.batch_size // per_step


@dataclass
class WarmupCosine:
    """LR multiplier at a step: linear warmup to 1, then cosine down to min_ratio."""

    warmup: int
    total: int
    min_ratio: float

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class SequenceLM(nn.Module):
    """forward(input_ids) -> logits, so DDP sees the cache-free training forward as `forward`."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.forward_sequences(input_ids).logits


def step_indices(step: int, cfg: TrainConfig, num_sequences: int) -> torch.Tensor:
    """The global batch of `step`: consecutive slots of an endless stream of per-epoch shuffles."""
    start = step * cfg.batch_size
    out = []
    for pos in range(start, start + cfg.batch_size):
        epoch, i = divmod(pos, num_sequences)
        out.append(_epoch_order(cfg.seed, epoch, num_sequences)[i])
    return torch.stack(out)


@lru_cache(maxsize=1)  # one epoch's order at a time
def _epoch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def save_checkpoint(path: Path, model, optimizer, scheduler, step: int, cfg: TrainConfig) -> None:
    state = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "step": step, "data_position": step * cfg.batch_size, "rng": torch.get_rng_state(),
        "config": json.dumps(asdict(cfg), sort_keys=True),
    }
    tmp = path.with_name(path.name + ".partial")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a reader sees the old checkpoint or the new one, never half of one


def load_checkpoint(path: Path, model, optimizer, scheduler, cfg: TrainConfig) -> int:
    """Restore everything a step depends on; returns the number of steps already done."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        saved = json.loads(state["config"])
    except Exception as e:  # zip, pickle and key errors all mean the same thing to the user
        raise ForetellError(f"checkpoint {path} is corrupt or unreadable ({type(e).__name__}); delete it to start this stage over") from None
    if saved != json.loads(json.dumps(asdict(cfg), sort_keys=True)):
        changed = sorted(k for k in saved if saved[k] != asdict(cfg).get(k))
        raise ForetellError(f"checkpoint {path} was made with other training settings ({', '.join(changed)}); "
                            "use the same settings, another --out, or --no-resume")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def truncate_log(path: Path, after_step: int) -> None:
    """Drop log lines past the checkpoint a run resumes from (they will be written again)."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= after_step]
    path.write_text("".join(line + "\n" for line in keep))


def plot_losses(log_path: Path, png: Path, title: str) -> None:
    # start-up: matplotlib takes most of a second to import, and only plots use it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=1)
    ax.set(xlabel="step", ylabel="loss", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


class TrainingRun:
    """The bookkeeping of a training loop in its folder `out`, shared by train() and feature_loop.run_steps:
    AdamW on the module's parameters with warmup + cosine, the checkpoint (read back when resuming), one log
    row a step and the progress bar (the main process writes them), and the loss plot at the end."""

    def __init__(self, module: nn.Module, cfg: TrainConfig, out: Path, ctx: DistContext, resume: bool,
                 stop_after: int | None, desc: str):
        self.module, self.cfg, self.out, self.ctx, self.desc = module, cfg, out, ctx, desc
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, cfg.steps // 10)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, WarmupCosine(warmup, cfg.steps, cfg.min_lr_ratio))
        out.mkdir(parents=True, exist_ok=True)
        self.checkpoint, self.log = out / CHECKPOINT, out / LOG
        resuming = resume and self.checkpoint.is_file()
        self.start = load_checkpoint(self.checkpoint, module, self.optimizer, self.scheduler, cfg) if resuming else 0
        if resuming and ctx.is_main:  # say so: a rerun that quietly continued looks like a new run
            print(f"foretell train: resuming {desc} from its checkpoint {self.checkpoint} at step {self.start} of "
                  f"{cfg.steps} (--no-resume starts over)")
        self.end = min(cfg.steps, stop_after) if stop_after is not None else cfg.steps
        self.bar = None

    def steps(self):
        """The steps left to run, behind a progress bar; log rows past the checkpoint are dropped first."""
        if self.ctx.is_main:
            truncate_log(self.log, self.start)
        self.bar = tqdm(range(self.start, self.end), initial=self.start, total=self.cfg.steps, desc=self.desc,
                        disable=not self.ctx.is_main)
        return self.bar

    def optimizer_step(self) -> dict:
        """Clip the gradients and step; the log row's grad_norm and the lr the step used."""
        grad_norm = nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        return {"grad_norm": float(grad_norm), "lr": lr}

    def record(self, row: dict, postfix: dict) -> None:
        """Log the row of the step just done (row["step"]: steps done), show `postfix`, checkpoint when due."""
        done = row["step"]
        if self.ctx.is_main:
            with open(self.log, "a") as f:
                f.write(json.dumps(row) + "\n")
            self.bar.set_postfix(**postfix)
        if done % self.cfg.checkpoint_every == 0 or done == self.end:
            if self.ctx.is_main:
                save_checkpoint(self.checkpoint, self.module, self.optimizer, self.scheduler, done, self.cfg)
            self.ctx.barrier()

    def finish(self) -> int:
        """Plot the losses and freeze the module again; returns the steps done."""
        self.bar.close()
        if self.ctx.is_main and self.log.is_file() and self.log.stat().st_size:
            plot_losses(self.log, self.out / "loss.png", self.desc)
        self.module.eval().requires_grad_(False)
        return self.end


def train_step(wrapped, model, run: TrainingRun, objective: Objective, batch_fn: BatchFn,
               index: torch.Tensor, cfg: TrainConfig, ctx: DistContext) -> dict:
    """One optimizer step: this process's micro-batches of the global batch `index`."""
    mine = index.split(cfg.micro_batch_size)[ctx.rank :: ctx.world_size]
    run.optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = {}
    seq_len = 0
    for j, micro in enumerate(mine):
        batch = batch_fn(micro)
        seq_len = batch["input_ids"].shape[1]
        sync = j == len(mine) - 1 or not ctx.active
        with (nullcontext() if sync else wrapped.no_sync()), torch.autocast(model.device.type, torch.bfloat16, enabled=cfg.bf16):
            loss, metrics = objective(wrapped(batch["input_ids"]), batch)
            (loss / len(mine)).backward()
        for key, value in {"loss": loss.item(), **metrics}.items():
            totals[key] = totals.get(key, 0.0) + value / len(mine)
    return {**{k: ctx.all_mean(v) for k, v in totals.items()}, **run.optimizer_step(), "seq_tokens": len(index) * seq_len}


def train(model: Transformer, objective: Objective, batch_fn: BatchFn, num_sequences: int, cfg: TrainConfig,
          out: Path, ctx: DistContext | None = None, resume: bool = True, stop_after: int | None = None,
          desc: str = "train") -> int:
    """Train `model` in place, checkpointing into `out`; returns the steps done (cfg.steps unless stopped)."""
    ctx = ctx or DistContext()
    cfg.micro_batches(ctx.world_size)  # validate the batch split before any work
    model.requires_grad_(True).train()
    wrapped = ctx.wrap(SequenceLM(model))
    run = TrainingRun(model, cfg, out, ctx, resume, stop_after, desc)
    if not resume:
        run.checkpoint.unlink(missing_ok=True)
    if run.start == 0:
        torch.manual_seed(cfg.seed)  # a resumed run has the checkpoint's RNG state instead
    for step in run.steps():
        t0 = time.perf_counter()
        index = step_indices(step, cfg, num_sequences)
        row = train_step(wrapped, model, run, objective, batch_fn, index, cfg, ctx)
        seconds = time.perf_counter() - t0
        speed = round(row.pop("seq_tokens") / seconds, 1)
        row = {"step": step + 1, **row, "seconds": round(seconds, 4), "tokens_per_s": speed}
        run.record(row, {"loss": f"{row['loss']:.4f}", "tok_s": f"{row['tokens_per_s']:.0f}"})
    return run.finish()
