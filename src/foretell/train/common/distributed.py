"""Data-parallel training on CPU processes (torch.distributed, gloo backend).

Every process holds the whole model and trains on its share of each global batch; DDP averages
the gradients, so N processes compute the step one process would with the same global batch.
Started either by `launch` (torch.multiprocessing.spawn) or by torchrun (environment variables).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1

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
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module)

    def all_mean(self, value: float) -> float:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / self.world_size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def from_environment() -> DistContext:
    """The context torchrun describes in the environment (a single process without it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    return DistContext(int(os.environ.get("RANK", "0")), world)


def _worker(rank: int, world: int, port: int, threads: int, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(DistContext(rank, world), *args)
    finally:
        dist.destroy_process_group()


def launch(fn: Callable, args: tuple, processes: int, threads: int | None = None) -> None:
    """Run fn(ctx, *args) on `processes` processes (fn must be importable: a module-level function)."""
    if processes <= 1:
        fn(from_environment(), *args)
        return
    import torch.multiprocessing as mp

    threads = threads or max(1, torch.get_num_threads() // processes)
    mp.spawn(_worker, args=(processes, free_port(), threads, fn, args), nprocs=processes, join=True)
