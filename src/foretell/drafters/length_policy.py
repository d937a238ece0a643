"""How many tokens to draft next step, chosen from what verification accepted so far.

A policy object is a configuration: each request's sizer (sizing.py) decodes with a copy of it, so what one
request's drafts did never sizes another's."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


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


def make_length_policy(name: str, gamma: int = 4) -> DraftLengthPolicy:
    """fixed (gamma tokens), rejection-rate (AdaSPEC's dynamic length, base gamma), additive (transformers' +2/-1)."""
    if name == "fixed":
        return FixedLength(gamma)
    if name == "rejection-rate":
        return RejectionRateLength(base=gamma)
    if name == "additive":
        return AdditiveLength(start=gamma)
    from foretell.errors import ForetellError

    raise ForetellError(f"unknown draft-length policy {name!r}; use fixed, rejection-rate or additive")
