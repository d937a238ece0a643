"""The draft gate: whether the drafter runs at all this pass (hardware-aware, lossless).

Drafting costs time, and on a CPU a bigger tree makes the target's pass slower too. When the
drafts are rarely accepted (a translation the draft never learned), or when prompt lookup's
branch already holds what the drafter would add (a GSM8K answer copying its question's
numbers), a pass without the drafter yields more tokens per second. The scheduler
(tree_scheduler.py) sizes a tree only after the drafter has paid for it; the gate decides
before, from what passes of each kind have delivered on this machine recently.

Per situation (the length of the n-gram whose continuation the result cache offers as a branch,
0 = no branch: a longer key predicts better, so drafting adds less) it keeps decayed means of
tokens per pass and seconds per pass with and without the drafter, and takes the choice with
more tokens per second. Every `explore_every`-th decision in a situation takes the other choice, so both
stay measured as the text and the machine's load change. When the drafter ran beside a branch,
the tokens the branch alone would have given (the accepted path's prefix along the branch, + 1)
count for the other choice too, so its estimate needs no extra passes.

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
class _Outcome:
    tokens: _Mean = field(default_factory=_Mean)  # tokens committed per pass
    seconds: _Mean = field(default_factory=_Mean)  # draft + verification seconds per pass

    def rate(self) -> float | None:
        tokens, seconds = self.tokens.value, self.seconds.value
        return None if tokens is None or seconds is None else tokens / max(seconds, 1e-9)


@dataclass
class DraftGate:
    explore_every: int = 8  # decisions per situation between tries of the choice not preferred (0 = never)
    decay: float = 0.9  # forgetting per recorded pass of a choice
    decisions: int = 0
    skipped: int = 0  # passes the drafter did not run (reports)
    _outcomes: dict[tuple[int, bool], _Outcome] = field(default_factory=dict)  # (situation, drafted) ->
    _counts: dict[int, int] = field(default_factory=dict)  # decisions per situation

    def __post_init__(self):
        if self.explore_every < 0 or not 0.0 < self.decay < 1.0:
            raise ForetellError(f"draft gate needs explore_every >= 0 and decay in (0, 1), got "
                                f"{self.explore_every}, {self.decay}")

    def _outcome(self, match: int, drafted: bool) -> _Outcome:
        return self._outcomes.setdefault((match, drafted), _Outcome())

    def should_draft(self, match: int) -> bool:
        """Run the drafter this pass? `match`: the n-gram length behind the result cache's branch (0 = none)."""
        self.decisions += 1
        draft_rate, skip_rate = self._outcome(match, True).rate(), self._outcome(match, False).rate()
        if draft_rate is None or skip_rate is None:  # measure the drafter first, then the pass without it
            choice = draft_rate is None
        else:
            count = self._counts[match] = self._counts.get(match, 0) + 1
            choice = draft_rate >= skip_rate
            if self.explore_every and count % self.explore_every == 0:
                choice = not choice
        self.skipped += not choice
        return choice

    def record(self, match: int, drafted: bool, tokens: int, seconds: float,
               branch_only_tokens: int | None = None) -> None:
        """One pass's outcome. branch_only_tokens: when the drafter ran beside a branch, what the
        branch alone would have committed."""
        outcome = self._outcome(match, drafted)
        outcome.tokens.add(tokens, self.decay)
        outcome.seconds.add(seconds, self.decay)
        if drafted and match and branch_only_tokens is not None:
            self._outcome(match, False).tokens.add(branch_only_tokens, self.decay)

    def summary(self) -> dict:
        rates = {f"{f'{m}-gram branch' if m else 'no branch'}, {'draft' if d else 'skip'}": round(o.rate() or 0.0, 2)
                 for (m, d), o in sorted(self._outcomes.items())}
        return {"decisions": self.decisions, "skipped": self.skipped, "tokens_per_s": rates}
