"""The draft gate (draft_gate.py): it measures both choices, then takes the one with more tokens
per second in each situation, explores the other now and then, and learns what the branch alone
would have given from passes where the drafter ran beside it. Exactness through the engine is
tested with the hidden-state drafter (tests/test_hidden_state.py)."""

import pytest

from foretell.draft_gate import DraftGate
from foretell.errors import ForetellError


def feed(gate: DraftGate, match: int, passes: int, draft=(2.0, 0.05), skip=(1.0, 0.04)) -> list[bool]:
    """Run `passes` decisions, recording (tokens, seconds) of the chosen kind; returns the choices."""
    choices = []
    for _ in range(passes):
        drafted = gate.should_draft(match)
        tokens, seconds = draft if drafted else skip
        gate.record(match, drafted, tokens, seconds)
        choices.append(drafted)
    return choices


def test_measures_both_then_prefers_the_faster_and_explores_the_other():
    gate = DraftGate(explore_every=4)
    choices = feed(gate, 0, 18)  # drafting: 40 tok/s, skipping: 25 tok/s
    assert choices[:2] == [True, False]  # the drafter first, then a pass without it
    later = choices[2:]
    assert later.count(False) == len(later) // 4  # one exploring pass in every 4 decisions
    assert gate.skipped == 1 + len(later) // 4 and gate.decisions == 18

    slow = DraftGate(explore_every=4)
    choices = feed(slow, 0, 18, draft=(1.2, 0.06))  # drafting: 20 tok/s, slower than plain passes
    assert choices[2:].count(True) == 16 // 4


def test_situations_are_kept_apart():
    gate = DraftGate(explore_every=0)
    feed(gate, 0, 6)  # no branch: drafting wins
    feed(gate, 3, 6, draft=(3.0, 0.06), skip=(2.8, 0.04))  # a 3-gram branch: the branch alone wins
    feed(gate, 1, 6, draft=(2.0, 0.06), skip=(1.2, 0.04))  # a 1-gram branch: drafting beside it wins
    assert gate.should_draft(0) and not gate.should_draft(3) and gate.should_draft(1)


def test_branch_only_tokens_update_the_skip_estimate_without_skipping():
    gate = DraftGate(explore_every=0)
    gate.record(2, True, 3, 0.06, branch_only_tokens=3)
    gate.record(2, False, 1, 0.04)  # one measured skip pass (its time), a poor one
    for _ in range(20):  # the drafter ran; the branch alone would have given as much
        gate.record(2, True, 3, 0.06, branch_only_tokens=3)
    assert not gate.should_draft(2)  # 3 tokens in 40 ms beats 3 in 60 ms
    summary = gate.summary()
    assert summary["tokens_per_s"]["2-gram branch, skip"] > summary["tokens_per_s"]["2-gram branch, draft"]


@pytest.mark.parametrize("kwargs", [{"explore_every": -1}, {"decay": 0.0}, {"decay": 1.0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ForetellError, match="draft gate"):
        DraftGate(**kwargs)
