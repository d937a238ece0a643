"""The draft gate: whether the drafter runs at all this pass (hardware-aware, lossless).

Drafting costs time, and on a CPU a bigger tree makes the target's pass slower too. When the
drafts are rarely accepted (a translation the draft never learned), or when prompt lookup's
branch already holds what the drafter would add (a GSM8K answer copying its question's
numbers), a pass without the drafter yields more tokens per second. The scheduler
(sizing/tree.py) sizes a tree only after the drafter has paid for it; the gate decides
before, from what passes of each kind have delivered on this machine.

Situations are told apart by the length of the n-gram whose continuation the result cache
offers as a branch (0 = no branch): a longer key predicts better, leaving the drafter less to
add. Per situation the gate keeps
  - the tokens a pass commits without the drafter: measured on passes without it, and on passes
    with it as what the branch alone would have given (the accepted path's prefix along the
    branch, + 1; exactly 1 without a branch),
  - the drafter's gain: tokens committed less that, on the passes it ran (a paired difference,
    so the branch's own luck cancels out),
  - the seconds of a pass with and without the drafter,
and drafts when (tokens without + gain) / seconds with >= tokens without / seconds without.
Token estimates start afresh with each request (`begin`: how well a drafter does depends on the
text), timings carry over (they are the machine's). After `explore_every` skipped passes in a
row in a situation the drafter runs once, so its gain stays measured as the text moves on.

Skipping changes only what the target verifies (the branch alone, or nothing: a plain pass),
never how it verifies, so the output is exactly the target's either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from foretell.errors import ForetellError


@dataclass
class _Mean:
    """A decayed mean (recent values weigh more)."""

    total: float = 0.0
    weight: float = 0.0

    def add(self, value: float, decay: float) -> None:
        self.total = self.total * decay + value
        self.weight = self.weight * decay + 1.0

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight else None


@dataclass
class _Situation:
    without: _Mean = field(default_factory=_Mean)  # tokens a pass commits without the drafter (this request)
    gain: _Mean = field(default_factory=_Mean)  # tokens the drafter adds to that, when it runs (this request)
    seconds_with: _Mean = field(default_factory=_Mean)  # draft + verification seconds (all requests)
    seconds_without: _Mean = field(default_factory=_Mean)
    skips_in_row: int = 0

    def rates(self) -> tuple[float, float] | None:
        """(tokens/s with the drafter, without), or None while something is unmeasured. Not the sizing chooser
        (sizing/chooser.best_prefix): these are tokens over measured seconds of whole passes, with and without the
        drafter, not node values over a cost curve, and should_draft breaks ties toward drafting (>=)."""
        parts = (self.without.value, self.gain.value, self.seconds_with.value, self.seconds_without.value)
        if any(x is None for x in parts):
            return None
        without, gain, with_s, without_s = parts
        return (without + gain) / max(with_s, 1e-9), without / max(without_s, 1e-9)


@dataclass
class DraftGate:
    explore_every: int = 4  # skipped passes in a row (per situation) before the drafter runs once (0 = never)
    decay: float = 0.8  # forgetting of token estimates, per pass recorded
    time_decay: float = 0.9  # forgetting of timings
    decisions: int = 0
    skipped: int = 0  # passes the drafter did not run (reports)
    _situations: dict[int, _Situation] = field(default_factory=dict)  # n-gram length of the branch (0 = none) ->

    def __post_init__(self):
        if self.explore_every < 0 or not (0.0 < self.decay < 1.0 and 0.0 < self.time_decay < 1.0):
            raise ForetellError(f"draft gate needs explore_every >= 0 and decay, time_decay in (0, 1), got "
                                f"{self.explore_every}, {self.decay}, {self.time_decay}")

    def _situation(self, match: int) -> _Situation:
        return self._situations.setdefault(match, _Situation())

    def begin(self) -> None:
        """A new request: forget token estimates (they depend on the text), keep timings."""
        for s in self._situations.values():
            s.without, s.gain, s.skips_in_row = _Mean(), _Mean(), 0

    def should_draft(self, match: int) -> bool:
        """Run the drafter this pass? `match`: the n-gram length behind the result cache's branch (0 = none)."""
        self.decisions += 1
        s = self._situation(match)
        if s.gain.value is None:  # measure the drafter first, then time a pass without it
            choice = True
        elif s.seconds_without.value is None:
            choice = False
        else:
            with_rate, without_rate = s.rates()
            probe = bool(self.explore_every) and s.skips_in_row >= self.explore_every
            choice = with_rate >= without_rate or probe
        self.skipped += not choice
        return choice

    def record(self, match: int, drafted: bool, tokens: int, seconds: float, without_tokens: int) -> None:
        """One pass's outcome: tokens committed and seconds taken; without_tokens: what the pass would have
        committed without the drafter (with the drafter: the branch's accepted prefix + 1; else = tokens)."""
        s = self._situation(match)
        s.without.add(without_tokens, self.decay)
        if drafted:
            s.gain.add(tokens - without_tokens, self.decay)
            s.seconds_with.add(seconds, self.time_decay)
            s.skips_in_row = 0
        else:
            s.seconds_without.add(seconds, self.time_decay)
            s.skips_in_row += 1

    def summary(self) -> dict:
        rates = {}
        for match, s in sorted(self._situations.items()):
            r = s.rates()
            if r is not None:
                rates[f"{match}-gram branch" if match else "no branch"] = {"draft": round(r[0], 2), "skip": round(r[1], 2)}
        return {"decisions": self.decisions, "skipped": self.skipped, "tokens_per_s": rates}
