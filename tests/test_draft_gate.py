"""The draft gate (sizing/gate.py): it measures the drafter, then a pass without it, then drafts only
where that gives more tokens per second, per situation (the lookup branch's n-gram length), probes
the drafter again after a run of skipped passes, learns from paired gains (the branch alone's
tokens on the same pass), and forgets token estimates per request but not timings. Exactness
through the engine is tested with the hidden-state drafter and the parallel head
(tests/test_hidden_state.py, tests/test_result_cache.py)."""

import pytest

from foretell.errors import ForetellError
from foretell.sizing.gate import DraftGate


def feed(gate: DraftGate, match: int, passes: int, draft=(2.0, 0.05), skip=(1.0, 0.04)) -> list[bool]:
    """Run `passes` decisions; a drafted pass commits draft[0] tokens in draft[1] seconds, of which the
    branch alone would have given skip[0]; a skipped pass commits skip[0] in skip[1]."""
    choices = []
    for _ in range(passes):
        drafted = gate.should_draft(match)
        tokens, seconds = draft if drafted else skip
        gate.record(match, drafted, tokens, seconds, skip[0])
        choices.append(drafted)
    return choices


def test_measures_both_then_keeps_the_faster():
    gate = DraftGate(explore_every=4)
    choices = feed(gate, 0, 12)  # drafting: 40 tok/s, without: 25 tok/s
    assert choices[:2] == [True, False] and all(choices[2:])  # drafter first, one timed skip, then drafting
    assert gate.skipped == 1 and gate.decisions == 12


def test_a_slow_drafter_is_skipped_and_probed_after_each_run_of_skips():
    gate = DraftGate(explore_every=4)
    choices = feed(gate, 0, 17, draft=(1.2, 0.06))  # drafting: 20 tok/s, slower than plain passes (25)
    assert choices[:2] == [True, False]
    assert choices[2:] == [False] * 3 + [True] + ([False] * 4 + [True]) * 2 + [False]  # 4 skips in a row, a probe


def test_situations_are_kept_apart():
    gate = DraftGate(explore_every=0)
    feed(gate, 0, 6)  # no branch: drafting wins
    feed(gate, 3, 6, draft=(3.0, 0.06), skip=(2.8, 0.04))  # a 3-gram branch: the branch alone wins
    feed(gate, 2, 6, draft=(3.0, 0.06), skip=(1.5, 0.04))  # a 2-gram branch: drafting beside it wins
    assert gate.should_draft(0) and not gate.should_draft(3) and gate.should_draft(2)
    summary = gate.summary()["tokens_per_s"]
    assert summary["3-gram branch"]["skip"] > summary["3-gram branch"]["draft"]
    assert summary["no branch"]["draft"] > summary["no branch"]["skip"]


def test_token_estimates_restart_with_each_request_timings_stay():
    gate = DraftGate(explore_every=0)
    feed(gate, 0, 4, draft=(1.2, 0.06))  # a text the drafter does badly on: skipped
    assert not gate.should_draft(0)
    gate.begin()  # the next request: the drafter is measured again, the timings are kept
    assert gate.should_draft(0)
    gate.record(0, True, 3, 0.06, 1)  # and this text suits it
    assert gate.should_draft(0), "no second timing pass: the skip timing carried over"


def test_the_gain_is_paired_with_the_branch_on_the_same_pass():
    """Branch quality swings from pass to pass; the drafter adds nothing. Unpaired means of tokens with
    and without could favour either side by luck; the paired gain is exactly 0, so skipping wins."""
    gate = DraftGate(explore_every=0)
    swings = [1, 6, 1, 6, 1, 6]
    for i, branch_tokens in enumerate(swings):
        drafted = gate.should_draft(2)
        # with the drafter: what the branch gave, no more, in more time
        gate.record(2, drafted, branch_tokens, 0.05 if drafted else 0.04, branch_tokens)
    assert not gate.should_draft(2)


@pytest.mark.parametrize("kwargs", [{"explore_every": -1}, {"decay": 0.0}, {"decay": 1.0}, {"time_decay": 1.5}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ForetellError, match="draft gate"):
        DraftGate(**kwargs)
