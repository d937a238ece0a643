"""How many draft tokens each request of a batch may have verified in one target pass.

One pass verifies every active request's proposal. Its cost grows with the total tokens it carries
(c(N): the target's measured cost curve), so as the batch grows a verified draft token costs more relative to
what it returns, and speculation must shrink or it slows serving down. Two policies:

- BatchAwareBudget (foretell's): every proposed draft node has a value, the chance the target accepts it (its
  path probability under the drafter, scaled by how well that request's drafter has been calibrated so far; a
  drafter without probabilities gets its request's measured acceptance by depth). Nodes are taken best first
  across all requests while the pass's expected tokens per second still rise: (B + sum of values) / c(B + n).
  Speculation turns itself off, for a request or the whole pass, exactly when it stops paying. The same rule runs
  once before drafting too, on each request's expected acceptance by depth and its drafter's measured seconds a
  level: a request whose drafts would not pay is not drafted at all (drafting it and dropping the drafts cost a
  batch of four more than its speculation won). What a pass costs beyond the single-sequence curve (each request's
  attention over its own cache, its bookkeeping) is learned from the passes served.
- FixedByBatchSize (the peer): a draft length per batch-size range, as vLLM configures it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from foretell.sizing.chooser import best_prefix
from foretell.types import Proposal


def node_values(proposal: Proposal, acceptance: list[float], calibration: float,
                steps: dict[int, float] | None = None) -> list[float]:
    """The chance each node of a proposal is accepted: a path probability (product of draft_prob along its
    ancestors) times `calibration`, or, without draft probabilities, the request's acceptance rate at each depth
    (`acceptance[d]`: accepted / proposed at depth d + 1) multiplied along the path. steps: nodes whose chance given
    their parent is known otherwise (a result-cache branch's, Decoding.branch_steps)."""
    steps = steps or {}
    n = proposal.size
    if n == 0:
        return []
    parents = proposal.parents.tolist() if proposal.parents is not None else list(range(-1, n - 1))
    probs = proposal.draft_prob.tolist() if proposal.draft_prob is not None else None
    values: list[float] = []
    depth: list[int] = []
    for i, p in enumerate(parents):
        depth.append(depth[p] + 1 if p >= 0 else 0)
        if i in steps:
            step = steps[i]
        else:
            step = min(1.0, probs[i] * calibration) if probs is not None else depth_rate(acceptance, depth[i])
        values.append(step * (values[p] if p >= 0 else 1.0))
    return values


def depth_rate(acceptance: list[float], depth: int) -> float:
    """The acceptance rate at `depth` (0: the first draft token): past the history the last rate, without any 0.5."""
    if depth < len(acceptance):
        return acceptance[depth]
    return acceptance[-1] if acceptance else 0.5


@dataclass
class DepthAcceptance:
    """Accepted and verified draft tokens by depth, pooled over the requests one drafter served: the estimate a
    request's own counts are smoothed towards. Without it a request whose first draft was rejected would value
    every later draft at zero, have none verified again, and never learn otherwise."""

    accepted: list[int] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)
    weight: float = 4.0  # how many of a request's own verified drafts at a depth count as much as the pool

    def add(self, accepted: list[int], proposed: list[int]) -> None:
        for i, (a, p) in enumerate(zip(accepted, proposed)):
            if i == len(self.proposed):
                self.accepted.append(0)
                self.proposed.append(0)
            self.accepted[i] += a
            self.proposed[i] += p

    def merged(self, others: list[tuple[list[int], list[int]]]) -> DepthAcceptance:
        pool = DepthAcceptance(list(self.accepted), list(self.proposed), self.weight)
        for accepted, proposed in others:
            pool.add(accepted, proposed)
        return pool

    def rates(self, accepted: list[int], proposed: list[int]) -> list[float]:
        """A request's acceptance by depth: its own counts with `weight` pseudo-counts at the pooled rate (itself
        a rate with one pseudo-count at 0.5)."""
        depth = max(len(self.proposed), len(proposed))
        own = lambda counts, d: counts[d] if d < len(counts) else 0  # noqa: E731
        rates = []
        for d in range(depth):
            pooled = (own(self.accepted, d) + 0.5) / (own(self.proposed, d) + 1)
            rates.append((own(accepted, d) + self.weight * pooled) / (own(proposed, d) + self.weight))
        return rates


@dataclass
class Calibration:
    """Per request: accepted tokens over the values of the nodes it had verified (how optimistic its drafter's
    probabilities are), with a prior of one pass's worth at 0.5."""

    accepted: float = 0.5
    predicted: float = 1.0

    @property
    def factor(self) -> float:
        return self.accepted / self.predicted

    def update(self, predicted: float, accepted: int) -> None:
        self.predicted += predicted
        self.accepted += accepted


@dataclass
class BatchAwareBudget:
    """Caps per request (draft nodes it keeps, best first) that maximise the pass's expected tokens per second."""

    cost: Callable[[int], float]  # seconds of a target pass over this many tokens in all (fixed: memoized)
    per_request: float = 0.0  # seconds each request adds to a pass regardless of tokens (its attention, bookkeeping)
    name: str = "batch-aware"
    smoothing: float = 0.1  # observe()'s moving average
    _costs: dict[int, float] = field(default_factory=dict, repr=False)

    def pass_cost(self, tokens: int) -> float:
        """cost(tokens), each count computed once: caps asks ~100 a pass, a curve interpolation in Python each."""
        if tokens not in self._costs:
            self._costs[tokens] = self.cost(tokens)
        return self._costs[tokens]

    def caps(self, values: list[list[float]], draft_seconds: list[float] | None = None) -> list[int]:
        """values[i]: request i's node values in proposal order (parents first). Returns how many of its nodes
        each request keeps; node order is kept, so a prefix is always a valid tree. draft_seconds[i] (before
        drafting): what each of request i's nodes costs to draft, one level of its drafter."""
        b = len(values)
        fixed = self.per_request * b
        # Nodes best first across requests, by value per second of drafting and verifying it (values never grow
        # along a path, so a node comes after its ancestors; ties keep proposal order). The whole order is scored
        # and its best prefix kept, not stopped at the first node that does not pay: a cost curve with steps can
        # make one more token a loss and three a gain.
        drafts = draft_seconds if draft_seconds is not None else [0.0] * b
        token = max(self.pass_cost(b + 1) - self.pass_cost(b), 1e-9)
        heap = [(-v[0] / (drafts[i] + token), i, 0) for i, v in enumerate(values) if v]
        heapq.heapify(heap)
        order: list[int] = []
        taken: list[float] = []  # the values in that order
        drafting = [0.0]  # drafting[n]: seconds drafting the first n nodes of the order
        while heap:
            _, i, j = heapq.heappop(heap)
            order.append(i)
            taken.append(values[i][j])
            drafting.append(drafting[-1] + drafts[i])
            if j + 1 < len(values[i]):
                heapq.heappush(heap, (-values[i][j + 1] / (drafts[i] + token), i, j + 1))
        # Every request produces one token per pass without drafts (start = b); a pass of n nodes carries b + n
        # tokens and costs the curve there plus each request's fixed share.
        best_taken = best_prefix(taken, drafting.__getitem__, lambda rows: self.pass_cost(b - 1 + rows) + fixed,
                                 start=float(b)).n
        caps = [0] * b
        for i in order[:best_taken]:
            caps[i] += 1
        return caps

    def observe(self, tokens: int, requests: int, seconds: float) -> None:
        """A decode pass of `requests` requests and `tokens` tokens in all took `seconds`: per_request follows what
        the pass cost beyond the curve, a moving average (a request's attention grows with its context)."""
        if requests < 1:
            return
        residual = max(0.0, (seconds - self.pass_cost(tokens)) / requests)
        self.per_request += self.smoothing * (residual - self.per_request)


def chain_values(acceptance: list[float], depth: int) -> list[float]:
    """Before drafting: the chance each level 1..depth of a request's next proposal is reached, from its
    acceptance by depth (depth_rate)."""
    values, reach = [], 1.0
    for d in range(depth):
        reach *= depth_rate(acceptance, d)
        values.append(reach)
    return values


@dataclass
class DraftSeconds:
    """Seconds one draft level costs, per drafter (a moving average over the proposals drafted in a batch)."""

    per_level: dict[str, float] = field(default_factory=dict)
    smoothing: float = 0.2

    def get(self, drafter: str) -> float:
        return self.per_level.get(drafter, 0.0)  # not measured yet: drafting is tried, and measured

    def record(self, drafter: str, levels: int, seconds: float) -> None:
        if levels < 1:
            return
        now = seconds / levels
        old = self.per_level.get(drafter)
        self.per_level[drafter] = now if old is None else old + self.smoothing * (now - old)


@dataclass
class FixedByBatchSize:
    """Draft nodes per request by batch size: `lengths[k]` for batches up to `limits[k]`, 0 beyond (vLLM's
    num_speculative_tokens per batch-size range)."""

    limits: tuple[int, ...] = (1, 4, 8)
    lengths: tuple[int, ...] = (8, 4, 2)
    name: str = "fixed-by-batch-size"

    def length(self, batch: int) -> int:
        """Draft nodes a request at this batch size."""
        return next((length for limit, length in zip(self.limits, self.lengths) if batch <= limit), 0)

    def caps(self, values: list[list[float]]) -> list[int]:
        n = self.length(len(values))
        return [min(n, len(v)) for v in values]


def truncate(proposal: Proposal, keep: int) -> Proposal:
    """The first `keep` nodes of a proposal whose parents come before their children (a valid smaller tree)."""
    if keep >= proposal.size:
        return proposal
    cut = slice(0, keep)
    return Proposal(
        tokens=proposal.tokens[cut],
        q=None if proposal.q is None else proposal.q[cut],
        parents=None if proposal.parents is None else proposal.parents[cut],
        draft_prob=None if proposal.draft_prob is None else proposal.draft_prob[cut],
    )


@dataclass
class BudgetStats:
    """What the policy did over a run (reported by the serving benchmark)."""

    by_batch: dict[int, list[int]] = field(default_factory=dict)  # batch size -> [passes, kept nodes]
    passes: int = 0
    requests: int = 0
    proposed: int = 0
    kept: int = 0
    off_passes: int = 0  # passes where no request kept a draft token

    def record(self, proposed: list[int], caps: list[int]) -> None:
        self.passes += 1
        self.requests += len(caps)
        self.proposed += sum(proposed)
        self.kept += sum(caps)
        self.off_passes += int(sum(proposed) > 0 and sum(caps) == 0)
        entry = self.by_batch.setdefault(len(caps), [0, 0])
        entry[0] += 1
        entry[1] += sum(caps)

