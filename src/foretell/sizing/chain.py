"""How many tokens to draft next step, chosen from what verification accepted so far.

A policy object is a configuration: each request's sizer (sizing/request.py) decodes with a copy of it, so what one
request's drafts did never sizes another's."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from foretell.errors import ForetellError
from foretell.sizing.chooser import best_prefix
from foretell.sizing.cost import CostCurve


class DraftLengthPolicy(Protocol):
    def next_length(self) -> int: ...

    def update(self, proposed: int, accepted: int) -> None: ...


@dataclass
class FixedLength:
    gamma: int = 4

    def next_length(self) -> int:
        return self.gamma

    def update(self, proposed: int, accepted: int) -> None:
        pass


@dataclass
class RejectionRateLength:
    """Seed 001's rule: draft longer when recent drafts are rarely rejected, shorter when often.

    The rejection rate is measured over the last `window` draft tokens: below `low` use
    base + 2 (at most `max_gamma`), above `high` use base - 1 (at least `min_gamma`), else base.
    """

    base: int = 5
    low: float = 0.2
    high: float = 0.4
    min_gamma: int = 3
    max_gamma: int = 8
    window: int = 32
    _outcomes: deque = field(default_factory=deque, repr=False)  # 1 = rejected draft token

    def next_length(self) -> int:
        if not self._outcomes:
            return self.base
        rate = sum(self._outcomes) / len(self._outcomes)
        if rate < self.low:
            return min(self.base + 2, self.max_gamma)
        if rate > self.high:
            return max(self.base - 1, self.min_gamma)
        return self.base

    def update(self, proposed: int, accepted: int) -> None:
        # Draft tokens after the first rejection were never judged; count the rejected one.
        judged = min(proposed, accepted + 1)
        for i in range(judged):
            self._outcomes.append(0 if i < accepted else 1)
        while len(self._outcomes) > self.window:
            self._outcomes.popleft()


@dataclass
class AdditiveLength:
    """transformers' assisted-generation heuristic: +2 after a fully accepted draft, else -1."""

    start: int = 5
    min_gamma: int = 1
    max_gamma: int = 16
    _gamma: int | None = None

    def next_length(self) -> int:
        if self._gamma is None:
            self._gamma = self.start
        return self._gamma

    def update(self, proposed: int, accepted: int) -> None:
        g = self.next_length()
        self._gamma = min(g + 2, self.max_gamma) if accepted == proposed else max(g - 1, self.min_gamma)


def expected_chain_tokens(acceptance: list[float], gamma: int) -> float:
    """1 + sum_k prod_{i<k} a_i: the bonus/recovered token plus each draft reached and accepted.

    acceptance[i] is the chance draft i+1 passes given draft i passed; the last entry repeats.
    """
    total = 1.0
    for reach in chain_reach(acceptance, gamma):
        total += reach
    return total


def chain_reach(acceptance: list[float], gamma: int) -> list[float]:
    """prod_{i<k} a_i for k = 1..gamma: the chance draft k is reached and accepted (expected_chain_tokens' terms)."""
    values, reach = [], 1.0
    for i in range(gamma):
        reach *= acceptance[min(i, len(acceptance) - 1)] if acceptance else 0.0
        values.append(reach)
    return values


def best_chain_length(acceptance: list[float], target: CostCurve, draft_step_seconds: float, max_gamma: int) -> int:
    """The draft length with the highest expected tokens per second (0 = do not draft; ties: the shorter)."""
    return best_prefix(chain_reach(acceptance, max_gamma), lambda g: g * draft_step_seconds, target).n


@dataclass
class HardwareAwareLength:
    """Draft length policy: the measured cost curve plus running per-position acceptance."""

    target: CostCurve
    draft_step_seconds: float
    max_gamma: int = 12
    prior: float = 0.7
    decay: float = 0.9  # exponential forgetting of old verification outcomes
    _passed: list[float] = field(default_factory=list)
    _reached: list[float] = field(default_factory=list)

    def acceptance(self) -> list[float]:
        # A pseudo-count of 1 at the prior keeps unvisited positions sensible.
        return [(p + self.prior) / (r + 1.0) for p, r in zip(self._passed, self._reached)] or [self.prior]

    def next_length(self) -> int:
        return max(1, best_chain_length(self.acceptance(), self.target, self.draft_step_seconds, self.max_gamma))

    def update(self, proposed: int, accepted: int) -> None:
        while len(self._reached) < proposed:
            self._reached.append(0.0)
            self._passed.append(0.0)
        self._reached = [r * self.decay for r in self._reached]
        self._passed = [p * self.decay for p in self._passed]
        for i in range(min(proposed, accepted + 1)):  # drafts after the first rejection were not judged
            self._reached[i] += 1.0
            self._passed[i] += 1.0 if i < accepted else 0.0


def make_length_policy(name: str, gamma: int = 4) -> DraftLengthPolicy:
    """fixed (gamma tokens), rejection-rate (AdaSPEC's dynamic length, base gamma), additive (transformers' +2/-1)."""
    if name == "fixed":
        return FixedLength(gamma)
    if name == "rejection-rate":
        return RejectionRateLength(base=gamma)
    if name == "additive":
        return AdditiveLength(start=gamma)
    raise ForetellError(f"unknown draft-length policy {name!r}; use fixed, rejection-rate or additive")
