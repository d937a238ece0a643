"""Continuous batching: one target pass verifies every active request's drafts.

Requests join and leave between passes. Each pass packs, for every active request, its last token and its
proposal (chain, tree or nothing), and for a request still reading its prompt the next chunk of it, into one
target forward (runtime/packed.py): the projections and MLPs run once over all those tokens, attention
per request over its own KV cache with its own tree mask. Every request is then verified with its own sampling
parameters and generator, by the same per-request steps a lone request runs (decoding.py), so each request's
output is what it would be alone.

Each request has its own Engine (its own drafter state, length policy and extras; drafter weights shared),
made by `new_engine`. A budget policy (sizing/batch.py) caps how many draft tokens each request may have
verified in a pass once the batch has more than one request.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from foretell.config import DEFAULT_PREFILL_CHUNK
from foretell.decoding import Decoding
from foretell.engine import Engine
from foretell.errors import ForetellError
from foretell.prefix_cache import PrefixCache, common_length
from foretell.runtime.packed import forward_packed, run_draft_passes
from foretell.sizing.batch import (
    BatchAwareBudget, BudgetStats, Calibration, DepthAcceptance, DraftSeconds, FixedByBatchSize, chain_values,
    node_values,
)
from foretell.types import Chunk, SamplingParams


PLANNED_DEPTH = 8  # the deepest level the pre-draft rule weighs (acceptance that deep is rarely worth a pass)


@dataclass
class Request:
    """A request in the batch: its decoding state once admitted, and where its chunks go."""

    prompt_ids: list[int]
    params: SamplingParams
    on_chunk: Callable[[Chunk], None]  # called with each chunk; the last one carries the result
    on_error: Callable[[Exception], None]
    engine: Engine | None = None  # its configuration when it brings its own
    state: Decoding | None = None
    cancelled: bool = False
    calibration: Calibration = field(default_factory=Calibration)
    kept_value: float = 0.0  # the expected accepted tokens of the drafts the budget kept this pass
    admitted_at: float = 0.0
    left_finished: bool = False  # it finished, and has left the batch (release)

    @property
    def finished(self) -> bool:
        return self.left_finished or (self.state is not None and self.state.done)

    def cancel(self) -> None:
        """Leave the batch before the next pass; its KV cache is dropped with its state."""
        self.cancelled = True

    def release(self) -> None:
        """Out of the batch: drop its decoding state (KV caches, drafter state) and its callbacks. Callers keep
        requests (a server keeps one to cancel it) in objects its callbacks reach, a reference cycle that only
        Python's occasional full collection frees; without this every such request kept its caches until
        then, and a server's memory grew by ~1 GiB over a few hundred requests."""
        self.left_finished = self.finished
        self.state = self.engine = None
        self.on_chunk, self.on_error = _ignore, _ignore


def _ignore(_) -> None:
    pass


def drafter_name(request: Request) -> str:
    drafter = request.state.context.drafter if request.state is not None else None
    return drafter.name if drafter is not None else "none"


class BatchEngine:
    def __init__(self, target, new_engine: Callable[[], Engine],
                 budget: BatchAwareBudget | FixedByBatchSize | None = None, max_batch: int = 16,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, prefix_cache: PrefixCache | None = None):
        """prefix_cache: prompt prefixes kept across the requests (prefix_cache.py); None: every prompt read in
        full."""
        if max_batch < 1 or prefill_chunk < 1:
            raise ForetellError(f"max_batch and prefill_chunk must be >= 1, got {max_batch} and {prefill_chunk}")
        self.target = target
        self.new_engine = new_engine
        self.budget = budget
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk  # prompt tokens read per pass: a long prompt never stalls the others
        self.prefix_cache = prefix_cache
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []
        self.budget_stats = BudgetStats()
        self.served_acceptance: dict[str, DepthAcceptance] = {}  # by drafter name, over requests that left
        self.draft_seconds = DraftSeconds()  # what a draft level costs, by drafter name (the budget's pre-draft rule)

    def submit(self, prompt_ids: list[int], params: SamplingParams, on_chunk: Callable[[Chunk], None],
               on_error: Callable[[Exception], None], engine: Engine | None = None) -> Request:
        """Queue a request; `engine`: its own configuration (another drafter over the same target), else a fresh
        one from new_engine."""
        if engine is not None and engine.target is not self.target:
            raise ForetellError("a request's engine must decode with the batch's target model")
        request = Request(list(prompt_ids), params, on_chunk, on_error, engine=engine)
        self.waiting.append(request)
        return request

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def step(self) -> None:
        """One target pass over every active request (admitting waiting ones first)."""
        with torch.inference_mode():
            self._admit()
            prefills, decodes = self._plan()
            if not prefills and not decodes:
                return
            passes = [p for _, p in prefills] + [p for _, p in decodes]
            started = time.perf_counter()
            outputs = forward_packed(self.target, passes)
            if isinstance(self.budget, BatchAwareBudget) and not prefills:  # a prompt chunk is off the curve's scale
                self.budget.observe(sum(p.input_ids.numel() for p in passes), len(passes),
                                    time.perf_counter() - started)
            for (request, step), out in zip(prefills, outputs):
                request.state.prefilled_pass(step, out)
            for (request, _), out in zip(decodes, outputs[len(prefills):]):
                self._settle(request, out)
            self._leave([r for r in self.active if r.finished or r.cancelled])

    def _leave(self, gone: list[Request]) -> None:
        """Requests out of the batch; what their drafts did joins their drafter's pooled acceptance."""
        for r in gone:
            if r.state is not None:
                stats = r.state.stats
                self.served_acceptance.setdefault(drafter_name(r), DepthAcceptance()).add(
                    stats.accepted_per_position, stats.proposed_per_position)
            r.release()
        left = {id(r) for r in gone}  # by identity: Request is a dataclass, == would compare every field
        self.active = [r for r in self.active if id(r) not in left]

    def _acceptance(self, ready: list[Request]) -> list[list[float]]:
        """Each request's acceptance by depth, smoothed towards what its drafter did for every request so far."""
        pools: dict[str, DepthAcceptance] = {}
        for name in {drafter_name(r) for r in ready}:
            pools[name] = self.served_acceptance.get(name, DepthAcceptance()).merged(
                [(r.state.stats.accepted_per_position, r.state.stats.proposed_per_position)
                 for r in self.active if r.state is not None and drafter_name(r) == name])
        return [pools[drafter_name(r)].rates(r.state.stats.accepted_per_position, r.state.stats.proposed_per_position)
                for r in ready]

    def sweep(self) -> None:
        """Drop cancelled requests now (their KV caches go with them), not at the next pass."""
        for r in self.waiting:
            if r.cancelled:
                r.release()
        self.waiting = deque(r for r in self.waiting if not r.cancelled)
        self._leave([r for r in self.active if r.cancelled])

    def run(self) -> None:
        """Step until every submitted request has finished (tests, benchmarks)."""
        while not self.idle:
            self.step()

    def _admit(self) -> None:
        self._leave([r for r in self.active if r.cancelled])
        while self.waiting and len(self.active) < self.max_batch:
            request = self.waiting.popleft()
            if request.cancelled:
                continue
            try:
                engine = request.engine or self.new_engine()
                request.state = engine.start(request.prompt_ids, request.params, self.prefix_cache)
            except ForetellError as e:
                request.on_error(e)
                continue
            request.admitted_at = time.perf_counter()
            self.active.append(request)

    def _plan(self):
        """The prefill chunks (at most prefill_chunk prompt tokens in all, oldest request first) and the decode
        passes of this step, each a (request, TargetPass)."""
        prefills, room = [], self.prefill_chunk
        for i, request in enumerate(self.active):
            if not request.state.prefilling or room <= 0 or self._follows(request, self.active[:i]):
                continue
            request.state.look_again()
            if request.state.prefilling:
                step = request.state.prefill_pass(room)
                room -= step.input_ids.numel()
                prefills.append((request, step))
        ready = [r for r in self.active if not r.state.prefilling]
        batched = self.budget is not None and len(self.active) > 1
        acceptance = self._acceptance(ready) if batched else []
        limits = self._draft_limits(ready, acceptance) if batched else [None] * len(ready)
        proposals = self._draft_all(ready, limits)
        if batched and any(p.size for p in proposals):
            values = [node_values(p, rates, r.calibration.factor, r.state.branch_steps())
                      for p, r, rates in zip(proposals, ready, acceptance)]
            caps = self.budget.caps(values)
            self.budget_stats.record([p.size for p in proposals], caps)
            for r, cap, v in zip(ready, caps, values):
                r.state.keep(cap)
                r.kept_value = sum(v[:cap])
        return prefills, [(r, r.state.target_pass()) for r in ready]

    def _follows(self, request: Request, earlier: list[Request]) -> bool:
        """Whether `request` should wait to read its prompt: it has read none of it itself (the prefix cache may
        have given it a start), and an earlier request is still reading a prompt that covers at least half of this
        one and more than it has (a request's n choices, the same prompt sent twice), whose rows, kept when it is
        done, will serve this request's drafter too. Read once instead of side by side, the prompt also gets the
        whole prefill chunk, so neither request waits longer for its first token."""
        cache, state = self.prefix_cache, request.state
        if cache is None or not state.reading_from_cache or not cache.holds(len(state.ids) - 1, state.cache):
            return False  # (a prompt too large to keep: nothing to wait for)
        layers, ids = set(state.context.drafter_layers), state.ids
        shared = max(cache.min_tokens, len(ids) // 2, state.prefilled + cache.min_tokens)
        return any(other.state.prefilling and layers <= set(other.state.context.drafter_layers)
                   and common_length(tuple(other.state.ids), ids, len(ids) - 1) >= shared for other in earlier)

    def _draft_limits(self, ready: list[Request], acceptance: list[list[float]]) -> list[int | None]:
        """Before drafting, the depth each request may draft to: the batch-aware rule on its expected acceptance by
        depth and its drafter's seconds a level (0: not drafted this pass); the fixed rule's length (its nodes
        reach no deeper, so a deeper draft would be thrown away: as vLLM drafts num_speculative_tokens)."""
        if isinstance(self.budget, FixedByBatchSize):
            return [self.budget.length(len(ready))] * len(ready)
        if not isinstance(self.budget, BatchAwareBudget):
            return [None] * len(ready)
        depths = [min(r.state.context.max_draft, PLANNED_DEPTH) if r.state.context.drafter is not None else 0
                  for r in ready]
        values = [chain_values(rates, depth) for rates, depth in zip(acceptance, depths)]
        return self.budget.caps(values, [self.draft_seconds.get(drafter_name(r)) for r in ready])

    def _draft_all(self, ready: list[Request], limits: list[int | None]) -> list:
        """Every ready request's proposal, their drafters' forwards of a shared model packed depth by depth
        (run_together). A request's draft seconds (the pre-draft rule's cost of a level) are its share of the
        drafting: the whole drafting time split over the requests whose drafter ran (a result-cache branch alone
        costs no drafter forward, and would make a level look free)."""
        started = time.perf_counter()
        proposals = run_together([r.state.draft_steps(limit) for r, limit in zip(ready, limits)])
        drafted = [(r, p) for r, p in zip(ready, proposals) if p.size and r.state.drafter_ran]
        share = (time.perf_counter() - started) / max(1, len(drafted))
        for request, proposal in drafted:
            self.draft_seconds.record(drafter_name(request), proposal.depth, share)
        return proposals

    def _settle(self, request: Request, out) -> None:
        before = request.state.stats.accepted_tokens
        try:
            chunk = request.state.settle(out)
        except ForetellError as e:  # a drafter refusing the request: it leaves, the others go on
            request.cancelled = True
            request.on_error(e)
            return
        if request.kept_value:
            request.calibration.update(request.kept_value, request.state.stats.accepted_tokens - before)
            request.kept_value = 0.0
        request.on_chunk(chunk)


def run_together(generators: list) -> list:
    """Drive the requests' draft_steps generators together: whenever every unfinished one waits on a forward
    (drafters.base.DraftPass), the passes that share a model and step run as one packed forward
    (runtime/packed.run_draft_passes), and each gets its own output back. Returns what each generator returns, in
    order. A request's proposal is the one it would make alone: its forwards' rows get the arithmetic they get
    alone, and its sampling reads only its own state."""
    results: list = [None] * len(generators)
    waiting: dict[int, object] = {}

    def advance(i: int, output) -> None:
        try:
            waiting[i] = generators[i].send(output)
        except StopIteration as done:
            results[i] = done.value

    for i in range(len(generators)):
        advance(i, None)
    while waiting:
        groups: dict[tuple, list[int]] = {}
        for i, p in waiting.items():
            groups.setdefault(p.group, []).append(i)
        batch, waiting = waiting, {}
        for members in groups.values():
            outputs = run_draft_passes([batch[i] for i in members])
            for i, out in zip(members, outputs):
                advance(i, out)
    return results
