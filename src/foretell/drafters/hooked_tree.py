"""What the tree drafters fed by the engine's hidden-state hook share (parallel head, EAGLE-3, hidden state).

The target rows of newly committed tokens wait in `_pending` until the next proposal feeds them to the
drafter's module; a proposal first checks that every committed row arrived. With an AdaptiveTreeScheduler
each generation grows and trims its trees by a fresh schedule of it (`schedule`, made by start; the engine's
sizer shares it), and the drafter remembers the tree it sent, so that `verified` can report the outcome to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import time

import torch

from foretell.drafters.base import DrafterBase
from foretell.types import SamplingParams

if TYPE_CHECKING:
    from foretell.sizing.tree import AdaptiveTreeScheduler


class HookedTreeDrafter(DrafterBase):
    sizes_itself = True  # its tree shape (or the scheduler) sets depth and size, not the engine's length policy
    what = "drafter"  # named when rows are missing, e.g. "parallel head"

    def __init__(self, module: torch.nn.Module, scheduler: AdaptiveTreeScheduler | None, max_nodes: int,
                 target_layers: tuple[int, ...]):
        """max_nodes: the fixed tree's node cap (a scheduler's cap replaces it); target_layers: the hook layers
        whose rows the engine hands over after each commit."""
        self._module = module  # the drafter's own weights: it makes the KV cache and reads the hook's rows
        self.scheduler = scheduler  # the configuration; each generation sizes by a fresh schedule of it
        self.schedule: AdaptiveTreeScheduler | None = None
        self.max_nodes = scheduler.limits.max_nodes if scheduler is not None else max_nodes
        self.target_layers = tuple(target_layers)
        self.cache = None
        self.params = SamplingParams()
        self._pending: list[torch.Tensor] = []  # feature rows observed, not yet fed to the module
        self._observed = 0  # rows observed this generation = tokens in the target's cache
        self._sent: tuple[list[int], list[float]] = ([], [])  # the last tree's parents and scores (scheduler)

    def _new_generation(self, need: int, params: SamplingParams) -> None:
        """start's common part: a cache with room for `need` rows (reused while large enough), nothing pending."""
        if self.cache is None or self.cache.capacity < need:
            self.cache = self._module.new_cache(need)
        self.cache.truncate(0)
        self.params = params
        self.schedule = self.scheduler.fresh() if self.scheduler is not None else None
        self._sent = ([], [])
        self._pending, self._observed = [], 0

    def _rows(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """The rows [n, F] the module reads from the hook's layers."""
        return self._module.features(hidden)

    def observe(self, hidden: dict[int, torch.Tensor]) -> None:
        rows = self._rows(hidden)
        self._pending.append(rows)
        self._observed += rows.shape[0]

    def _check_observed(self, tokens: list[int]) -> None:
        if self._observed != len(tokens) - 1:
            raise RuntimeError(
                f"the {self.what} saw {self._observed} target rows for {len(tokens) - 1} committed tokens; "
                "the engine must hand over every committed row (observe) before propose"
            )

    def _take_pending(self) -> torch.Tensor:
        rows = torch.cat(self._pending)
        self._pending = []
        return rows

    def _schedule(self, scores: list[float], parents: list[int], t0: float,
                  level_times: list[float] | None = None) -> int:
        """How many nodes of a best-first tree (any prefix is closed under ancestors) the scheduler keeps;
        the kept ones are remembered for `verified`. t0: when the proposal started (its drafting time);
        level_times: when each level of a tree grown a level at a time was ready (perf_counter)."""
        levels = None if level_times is None else [t - t0 for t in level_times]
        n = self.schedule.choose(scores, parents, time.perf_counter() - t0, levels)
        self._sent = (parents[:n], scores[:n])
        return n

    def verified(self, accepted: int, verify_seconds: float, verified_nodes: int) -> None:
        """The engine's report on the last proposal: accepted path length, the pass's time and its size
        (larger than our tree when the engine merged in the result cache's branch)."""
        if self.schedule is not None and self._sent[0]:
            self.schedule.record(*self._sent, accepted, verify_seconds, verified_nodes)

    def cache_bytes(self) -> int:
        return self.cache.nbytes() if self.cache is not None else 0

    def modules(self) -> tuple[torch.nn.Module, ...]:
        return (self._module,)
