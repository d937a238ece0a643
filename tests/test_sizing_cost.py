"""Hardware-aware budgets: cost curves, the size choices they imply, and their use in decoding."""

import json

import pytest

from foretell.api import load
from foretell.config import TreeShape
from foretell.drafters.draft_tree import DraftTreeDrafter
from foretell.sizing.chain import HardwareAwareLength, best_chain_length, expected_chain_tokens
from foretell.sizing.cost import CostCurve, cost_curve
from foretell.sizing.tree import LevelBudget, best_tree_size
from foretell.types import SamplingParams

FLAT = CostCurve([1, 8, 64], [0.040, 0.042, 0.080], context=256)  # bf16 CPU-like: 8 tokens ~ 1
STEEP = CostCurve([1, 8, 64], [0.040, 0.080, 0.640], context=256)  # fp32-like: linear growth


def test_curve_interpolates_and_extrapolates():
    assert FLAT(1) == 0.040 and FLAT(0) == 0.040
    assert FLAT(36) == pytest.approx(0.061)
    assert STEEP(120) == pytest.approx(0.640 + (0.640 - 0.080) * 56 / 56)


def test_expected_chain_tokens_matches_the_closed_form():
    a, g = 0.7, 5
    assert expected_chain_tokens([a], g) == pytest.approx((1 - a ** (g + 1)) / (1 - a))


def test_flat_verification_favours_longer_drafts():
    acc = [0.8]
    flat = best_chain_length(acc, FLAT, draft_step_seconds=0.004, max_gamma=16)
    steep = best_chain_length(acc, STEEP, draft_step_seconds=0.004, max_gamma=16)
    assert flat > steep >= 1
    assert best_chain_length([0.05], STEEP, draft_step_seconds=0.02, max_gamma=8) == 0  # not worth drafting


def test_tree_size_trades_values_against_verification_cost():
    values = [0.9, 0.8, 0.6, 0.4, 0.3] + [0.05] * 60
    assert best_tree_size(values, FLAT, 0.02) > best_tree_size(values, STEEP, 0.02)
    assert best_tree_size([0.9, 0.01], STEEP, 0.02) == 1


def test_hardware_aware_length_adapts_to_acceptance():
    policy = HardwareAwareLength(FLAT, draft_step_seconds=0.004, max_gamma=12)
    for _ in range(30):
        policy.update(policy.next_length(), policy.next_length())  # everything accepted
    long = policy.next_length()
    for _ in range(30):
        policy.update(policy.next_length(), 0)  # everything rejected
    assert long > policy.next_length()


def test_cost_curve_is_measured_once_and_cached(tiny_pair, tmp_path):
    model = load(tiny_pair[0], "none").target.model
    first = cost_curve(model, "tiny", tmp_path, sizes=(1, 4), context=16, repeats=1)
    files = list((tmp_path / "costs").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["sizes"] == [1, 4]
    assert all(s > 0 for s in first.seconds)
    fast = {**json.loads(files[0].read_text()), "seconds": [1e-9, 2e-9]}  # faster than any pass: never stale
    files[0].write_text(json.dumps(fast))
    assert cost_curve(model, "tiny", tmp_path, sizes=(1, 4, 8)).seconds == [1e-9, 2e-9]  # read back, not remeasured


def test_a_cost_curve_measured_under_load_is_measured_again(tiny_pair, tmp_path, capsys):
    """A cached one-token pass far slower than the machine's now (the curve was measured while other work ran)
    misleads the scheduler into big trees: it is measured again; a damaged entry too."""
    model = load(tiny_pair[0], "none").target.model
    cost_curve(model, "tiny", tmp_path, sizes=(1, 4), context=16, repeats=1)
    path = next((tmp_path / "costs").glob("*.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "seconds": [100.0, 200.0]}))
    again = cost_curve(model, "tiny", tmp_path, sizes=(1, 2), context=16, repeats=1)
    assert again.sizes == [1, 2] and again.seconds[0] < 100.0
    assert "measured under load" in capsys.readouterr().err
    assert json.loads(path.read_text())["sizes"] == [1, 2]  # the new curve replaced it
    path.write_text(json.dumps({**json.loads(path.read_text()), "seconds": []}))
    assert cost_curve(model, "tiny", tmp_path, sizes=(1, 4), context=16, repeats=1).sizes == [1, 4]


@pytest.mark.parametrize("curve", [FLAT, STEEP], ids=["flat", "steep"])
def test_budgeted_tree_is_exact_and_within_bounds(tiny_pair, curve):
    target, draft = tiny_pair
    plain = load(target, "none")
    drafter = DraftTreeDrafter(load(draft, "none").target.model, 48, TreeShape(depth=5, top_k=3, total_tokens=16),
                               LevelBudget(curve))
    tuned = plain.with_drafter(drafter)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    prompt = [1, 5, 9, 12, 5, 9, 30]
    assert tuned.engine.generate(prompt, params).tokens == plain.engine.generate(prompt, params).tokens
    assert 1 <= drafter.last_budget <= 16
