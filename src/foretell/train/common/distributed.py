"""Data-parallel training: torch.distributed with gloo on CPU processes, NCCL on GPUs.

Every process holds the whole model and trains on its share of each global batch; the gradients are
summed (or, for DDP-wrapped models, averaged), so N processes compute the step one process would with the
same global batch. Started either by `launch` (torch.multiprocessing.spawn, one machine) or by torchrun
(environment variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; any number of machines).
Files the processes share (the run folder, the feature cache) are written by the main process, or by each
process for its own rows, between barriers; on several machines OUT must be on a shared filesystem.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
import torch.multiprocessing as mp


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    device: str = "cpu"  # where this process trains ("cuda:N" under NCCL); collectives run on it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def wrap(self, module: nn.Module) -> nn.Module:
        if not self.active:
            return module

        return DistributedDataParallel(module)

    def all_mean(self, value: float) -> float:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world_size

    def shard(self, items: torch.Tensor) -> torch.Tensor:
        """This process's share of a global batch: every world_size-th item from its rank."""
        return items[self.rank :: self.world_size]

    def sum_gradients(self, parameters) -> None:
        """Sum the trainable parameters' gradients over the processes, in one collective (a parameter with
        no gradient on some process counts as zeros there). Each process's loss terms must already be
        divided by the global batch's total weight, so the sum is the one-process gradient."""
        if not self.active:
            return
        params = [p for p in parameters if p.requires_grad]
        has = torch.tensor([float(p.grad is not None) for p in params], device=self.device)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(self.device)
                          for p in params] + [has])
        dist.all_reduce(flat)
        offset = 0
        for p, anywhere in zip(params, flat[-len(params):].tolist()):
            # No process had one: stay None, as one process would (the optimizer then skips the parameter).
            p.grad = flat[offset : offset + p.numel()].view_as(p).to(p.device, p.dtype).clone() if anywhere else None
            offset += p.numel()

    def sum_values(self, values: dict) -> dict:
        """Sum a dict of floats and tensors (statistics of each process's share) over the processes."""
        if not self.active:
            return values
        out = {}
        for key in sorted(values):  # the same order on every process
            value = values[key]
            t = torch.as_tensor(value, dtype=torch.float64).to(self.device)
            dist.all_reduce(t)
            out[key] = t.cpu() if isinstance(value, torch.Tensor) else t.item()
        return out

    def first(self, fn: Callable, *args, **kwargs):
        """fn on the main process, then (after a barrier) on the others: for steps that make a file once and
        read it after (data, caches), so only one process writes it."""
        result = fn(*args, **kwargs) if self.is_main else None
        self.barrier()
        if not self.is_main:
            result = fn(*args, **kwargs)
        return result

    def main_only(self, fn: Callable, *args, **kwargs):
        """fn on the main process only (None elsewhere), then a barrier."""
        result = fn(*args, **kwargs) if self.is_main else None
        self.barrier()
        return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def from_environment(device: str = "cpu") -> DistContext:
    """The context torchrun describes in the environment (a single process without it). device "cuda" puts
    each process on GPU LOCAL_RANK and uses NCCL; "cpu" uses gloo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return DistContext(int(os.environ.get("RANK", "0")), world, device)


def call_with_context(ctx: DistContext, fn: Callable, *args) -> None:
    """fn(*args, ctx=ctx): lets `launch` run the pipelines, which take the context as a keyword."""
    fn(*args, ctx=ctx)


def _worker(rank: int, world: int, port: int, threads: int, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    fn(DistContext(rank, world), *args)
    # Both ranks must be done with gloo before either tears its group down: a rank destroying its group
    # while the other still has a connection open aborts that one ("terminate called without an active
    # exception", seen in CI). On an exception spawn ends the other process anyway.
    dist.barrier()
    dist.destroy_process_group()


def launch(fn: Callable, args: tuple, processes: int, threads: int | None = None) -> None:
    """Run fn(ctx, *args) on `processes` processes (fn must be importable: a module-level function)."""
    if processes <= 1:
        fn(from_environment(), *args)
        return

    threads = threads or max(1, torch.get_num_threads() // processes)
    mp.spawn(_worker, args=(processes, free_port(), threads, fn, args), nprocs=processes, join=True)
