"""How fast a drafter could go: a fixed-budget sweep's tau set against the target's cost curve.

For a method that verified v draft tokens a pass and produced tau tokens a pass, three speedups
over plain decoding, each an upper bound on the one before it:
- measured: the tokens/s ratio of the bench run;
- free drafting, this machine: tau * c(1) / c(1 + v), with c the target's forward time by tokens
  (`foretell cost`): the drafter's and the engine's own time set to zero, the verification kept;
- any machine: tau. A pass is never cheaper than one plain decoding step (it is one target
  forward over at least the same token), so no hardware turns tau tokens a pass into more than
  tau times plain decoding's speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from foretell.bench.report import MethodSummary, budget_of


@dataclass(frozen=True)
class CeilingPoint:
    method: str
    base: str  # the method without its "@N"
    budget: int
    verified: float  # draft tokens verified per pass (<= budget)
    tau: float
    measured: float | None  # tokens/s ratio over plain in the run
    free_drafting: float  # tau * c(1) / c(1 + verified), at most tau (a noisy curve may dip)

    @property
    def any_hardware(self) -> float:
        return self.tau


def ceiling_points(overall: list[MethodSummary], cost) -> list[CeilingPoint]:
    """One point per fixed-budget method of a run, by base then budget; `cost(n)` is seconds for n tokens."""
    points = []
    for s in overall:
        parsed = budget_of(s.method)
        if parsed is None or s.tau is None:
            continue
        verified = s.verified_per_pass or 0.0
        points.append(CeilingPoint(s.method, parsed[0], parsed[1], verified, s.tau, s.speedup,
                                   min(s.tau, s.tau * cost(1) / cost(1 + verified))))
    return sorted(points, key=lambda p: (p.base, p.budget))
