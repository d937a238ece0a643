"""The adaptive scheduler (JetSpec, "causal parallel tree drafting"): each step's tree budget, depth and width, chosen
from what this machine costs now and what the drafter has recently been getting accepted.

Per step the drafter grows the best-first tree up to the scheduler's caps; the scheduler then
keeps the prefix of n nodes (n = 0: a plain pass) maximising expected tokens per second,

    rate(n) = (1 + sum of the n best node values) / (draft seconds + verify seconds(n + 1))  (sizing/chooser.best_prefix),

where a drafter that grows its tree a level at a time (EAGLE-3) charges a prefix only the drafting of the levels
it reaches: deeper trees pay for their own head steps, so where a level costs as much as it brings the chosen
depth, and with it next step's growth (`growth_limits`), stays shallow;

where a node's value is its cumulative draft probability, calibrated per depth against how
often nodes of that depth were really accepted, and verify seconds come from the target's
measured cost curve, corrected online by the verification times the engine reports (sizing/cost.CorrectedCost). The
correction is what makes the choice follow load: when another process competes for the cores,
big verification passes slow down more than small ones on a CPU, the corrected curve steepens
and the chosen budget shrinks. Sizes far from the current choice are probed now and then (one
step in `probe_every`, alternating a half and a double budget) so their corrections stay fresh.
Every choice is lossless: the scheduler only picks which drafts the target verifies.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from foretell.errors import ForetellError
from foretell.sizing.chooser import best_prefix, rate
from foretell.sizing.cost import CorrectedCost, CostCurve


@dataclass(frozen=True)
class ScheduleLimits:
    max_nodes: int = 64  # the largest tree ever verified (root excluded)
    max_depth: int = 8  # capped further by the drafter's own depth
    max_width: int = 4  # children per node
    probe_every: int = 16  # steps between probes of a smaller / larger budget (0 = never)
    decay: float = 0.9  # forgetting of old outcomes and timings

    def __post_init__(self):
        if min(self.max_nodes, self.max_depth, self.max_width) < 1:
            raise ForetellError(
                f"scheduler max_nodes, max_depth and max_width must be >= 1, got "
                f"{self.max_nodes}, {self.max_depth}, {self.max_width}"
            )
        if self.probe_every < 0 or not 0.0 < self.decay < 1.0:
            raise ForetellError(f"probe_every must be >= 0 and decay in (0, 1), got {self.probe_every}, {self.decay}")


@dataclass
class Choice:
    """One step's decision, kept for reports."""

    nodes: int
    depth: int
    width: int
    expected_tokens: float
    probe: bool = False


def node_depths(parents: list[int]) -> list[int]:
    """Depth of each node (1 = child of the root); parents precede their children."""
    depth_of: list[int] = []
    for p in parents:
        depth_of.append(1 if p < 0 else depth_of[p] + 1)
    return depth_of


def tree_shape(parents: list[int]) -> tuple[int, int]:
    """(depth, widest fan-out) of a tree given by parent indices (-1 = child of the root)."""
    fan: dict[int, int] = {}
    for p in parents:
        fan[p] = fan.get(p, 0) + 1
    return max(node_depths(parents), default=0), max(fan.values(), default=0)


@dataclass
class AdaptiveTreeScheduler:
    target: CostCurve  # the target's forward seconds vs tokens, measured once on this machine
    limits: ScheduleLimits = field(default_factory=ScheduleLimits)
    _passed: list[float] = field(default_factory=list)  # per depth: decayed accepted nodes
    _predicted: list[float] = field(default_factory=list)  # per depth: decayed sum of raw node probabilities
    _steps: int = 0
    history: list[Choice] = field(default_factory=list)  # this schedule's choices (growth_limits reads the latest)
    _log: list[Choice] | None = field(default=None, repr=False)  # a fresh() copy's: the configured one's history
    cost: CorrectedCost | None = None  # the curve corrected online (made from `target`; copies share it)

    def __post_init__(self):
        if self.cost is None:
            self.cost = CorrectedCost(self.target, self.limits.decay)

    def fresh(self) -> AdaptiveTreeScheduler:
        """The schedule of a new request (a drafter's start makes one per generation): the same limits and cost
        curve, and the same cost corrections (the machine's timings carry over; the copy shares them); its own
        calibration, probe count and choices (the text's acceptance starts afresh). Its choices are also logged in
        this scheduler's history, which reports and benchmarks read over all requests."""
        schedule = copy.copy(self)  # shares the corrected cost (and any per-instance setting)
        schedule._passed, schedule._predicted, schedule._steps, schedule.history = [], [], 0, []
        schedule._log = self.history if self._log is None else self._log
        return schedule

    @property
    def last_choice(self) -> Choice | None:
        """The latest choice of this schedule (None before its first)."""
        return self.history[-1] if self.history else None

    def calibration(self, depth: int) -> float:
        """Accepted / predicted at this depth (1 with no evidence; a pseudo-count keeps it sane).
        Depths never verified yet borrow the deepest verified one's."""
        if not self._passed:
            return 1.0
        i = min(depth, len(self._passed)) - 1
        return (self._passed[i] + 1.0) / (self._predicted[i] + 1.0)

    def verify_seconds(self, tokens: int) -> float:
        """The cost curve at `tokens`, corrected by the verification times seen so far (sizing/cost.CorrectedCost)."""
        return self.cost(tokens)

    def choose(self, scores: list[float], parents: list[int], draft_seconds: float,
               level_seconds: list[float] | None = None) -> int:
        """How many of the best-first nodes to verify. scores: cumulative log-probabilities. level_seconds: from a
        drafter that grows a level at a time, its drafting time when level d was ready (level_seconds[d - 1]); a
        prefix reaching depth d is charged that instead of the whole draft_seconds."""
        if not scores:
            return 0
        depth_of = node_depths(parents)

        def drafting(depth: int) -> float:
            if not level_seconds:
                return draft_seconds
            return level_seconds[min(max(depth, 1), len(level_seconds)) - 1]

        # n = 0 is a plain pass: where wide passes cost much more than one token (a CPU without a fast
        # many-row matmul), no tree at all can be the fastest choice, the first level's drafting being spent
        # either way.
        values: list[float] = []
        deepest = [1]  # deepest[n]: the deepest level the first n nodes reach (the first level is drafted anyway)
        for score, depth, parent in zip(scores, depth_of, parents):
            # A node is reached only through its parent, so it is never worth more.
            values.append(min(math.exp(score) * self.calibration(depth), values[parent] if parent >= 0 else 1.0))
            deepest.append(max(deepest[-1], depth))
        best_n, _, best_expected = best_prefix(values, lambda n: drafting(deepest[n]), self.verify_seconds)
        self._steps += 1
        probe = bool(self.limits.probe_every) and self._steps % self.limits.probe_every == 0
        if probe:  # alternate a half and a double budget, so both neighbours' timings stay current
            up = (self._steps // self.limits.probe_every) % 2 == 0
            best_n = min(len(scores), max(1, best_n * 2)) if up else max(1, best_n // 2)
        depth, width = tree_shape(parents[:best_n])
        choice = Choice(best_n, depth, width, best_expected, probe)
        self.history.append(choice)
        if self._log is not None:
            self._log.append(choice)
        return best_n

    def growth_limits(self, recent: int = 8) -> tuple[int, int]:
        """(nodes, depth) worth drafting before `choose`: twice the largest of the last `recent` choices
        (room for the double-budget probe) and one level past the deepest, within the caps. Growing
        64 nodes to verify 5 costs a CPU drafter several milliseconds a pass."""
        chosen = [c for c in self.history[-recent:] if not c.probe]
        if not chosen:
            return self.limits.max_nodes, self.limits.max_depth
        nodes = max(8, 2 * max(c.nodes for c in chosen))
        return min(self.limits.max_nodes, nodes), min(self.limits.max_depth, max(c.depth for c in chosen) + 1)

    def record(self, parents: list[int], scores: list[float], accepted_depth: int, verify_seconds: float,
               verified_nodes: int | None = None) -> None:
        """Learn from one verification: the tree sent, how deep its accepted path went, how long it took.

        verified_nodes: the pass's real size when the engine added nodes to the tree (the result cache's
        branch); those may also carry the accepted path past the tree's depth (counted as its deepest level).
        """
        d = self.limits.decay
        depth_of = node_depths(parents)
        deepest = max(depth_of, default=0)
        while len(self._passed) < deepest:
            self._passed.append(0.0)
            self._predicted.append(0.0)
        self._passed = [x * d for x in self._passed]
        self._predicted = [x * d for x in self._predicted]
        for score, depth in zip(scores, depth_of):
            self._predicted[depth - 1] += math.exp(score)
        for depth in range(1, min(accepted_depth, deepest) + 1):
            self._passed[depth - 1] += 1.0
        self.cost.observe((verified_nodes if verified_nodes is not None else len(parents)) + 1, verify_seconds)

    def summary(self) -> dict:
        """Mean choices over the steps so far (for reports)."""
        steps = [c for c in self.history if not c.probe] or self.history
        if not steps:
            return {}
        mean = lambda xs: round(sum(xs) / len(xs), 2)  # noqa: E731
        return {
            "steps": len(self.history),
            "mean_nodes": mean([c.nodes for c in steps]),
            "mean_depth": mean([c.depth for c in steps]),
            "mean_width": mean([c.width for c in steps]),
            "cost_correction": self.cost.summary(),
        }


def best_tree_size(node_values: list[float], target: CostCurve, draft_seconds: float, min_size: int = 1) -> int:
    """Given the values (estimated acceptance probabilities) of candidate nodes sorted best first,
    the number to verify that maximises (1 + sum of kept values) / (draft + verify time): at least min_size
    (n = 0 is no candidate here)."""
    if not node_values:
        return min_size
    return best_prefix(node_values, draft_seconds, target, min_size=max(min_size, 1)).n


@dataclass(frozen=True)
class LevelBudget:
    """A draft-model tree's hardware-aware size (draft-tree, budget auto): of the best-first nodes grown so far,
    the prefix with the most expected tokens per second by the target's measured cost curve, and whether growing
    another level can still beat it. Node values: the draft's path probabilities, best first."""

    target: CostCurve

    def best(self, values: list[float], draft_seconds: float) -> tuple[int, float]:
        """The nodes to verify and their rate."""
        n = best_tree_size(values, self.target, draft_seconds)
        # 1 + sum(...) rather than the chooser's running sum, as before: the rate keeps its last bit
        return n, rate(1.0 + sum(values[:n]), draft_seconds, self.target, n + 1)

    def worth_another_level(self, values: list[float], gain: float, added: int, elapsed: float,
                            level_seconds: float) -> bool:
        """Grow deeper only if the next level's best case beats the current best rate: its `added` children can add
        at most `gain` (their parents' values) and cost about one more level's seconds."""
        n, best = self.best(values, elapsed)
        optimistic = rate(1.0 + sum(values[:n]) + gain, elapsed + level_seconds, self.target, n + added + 1)
        return optimistic > best
