"""The adaptive tree scheduler (JetSpec): budget choice from cost and acceptance,
its response to load (slower big passes) and to rejections, and exactness in decoding."""

import math

import pytest

from conftest import PROMPTS, greedy_params
from foretell.drafters.parallel_tree import ParallelHeadDrafter
from foretell.errors import ForetellError
from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head
from foretell.sizing.cost import CostCurve
from foretell.sizing.tree import AdaptiveTreeScheduler, Choice, ScheduleLimits, node_depths, tree_shape

SIZES = [1, 2, 4, 8, 16, 32, 64]


def curve(per_token: float, base: float = 0.01) -> CostCurve:
    """A target forward costing `base` plus `per_token` seconds per verified token."""
    return CostCurve(SIZES, [base + per_token * n for n in SIZES], context=256)


def chain(length: int, p: float) -> tuple[list[float], list[int]]:
    """Scores and parents of a chain whose every node has conditional probability p."""
    return [math.log(p) * (i + 1) for i in range(length)], [i - 1 for i in range(length)]


def no_probes(**kw) -> ScheduleLimits:
    return ScheduleLimits(probe_every=0, **kw)


def test_flat_cost_verifies_more_than_steep_cost():
    scores, parents = chain(32, 0.9)
    flat = AdaptiveTreeScheduler(curve(0.0001), no_probes())
    steep = AdaptiveTreeScheduler(curve(0.01), no_probes())
    assert flat.choose(scores, parents, 0.001) > steep.choose(scores, parents, 0.001)


def test_choice_maximises_the_expected_rate():
    scores, parents = chain(20, 0.8)
    sched = AdaptiveTreeScheduler(curve(0.002), no_probes())
    n = sched.choose(scores, parents, 0.003)

    def rate(k):
        expected = 1 + sum(math.exp(s) for s in scores[:k])
        return expected / (0.003 + curve(0.002)(k + 1))

    assert rate(n) == pytest.approx(max(rate(k) for k in range(0, 21)))


def test_a_plain_pass_is_chosen_when_every_tree_costs_more_than_it_yields():
    """Each verified token costing as much as a whole one-token pass (a CPU whose many-row matmul is emulated):
    even a likely draft does not pay, so nothing is verified; with the same drafts on a flat curve, some are."""
    scores, parents = chain(8, 0.6)
    steep = AdaptiveTreeScheduler(curve(0.05, base=0.0), no_probes())
    assert steep.choose(scores, parents, 0.002) == 0
    assert steep.history[-1].nodes == 0 and steep.history[-1].expected_tokens == 1.0
    assert AdaptiveTreeScheduler(curve(0.0005), no_probes()).choose(scores, parents, 0.002) > 0
    probing = AdaptiveTreeScheduler(curve(0.05, base=0.0), ScheduleLimits(probe_every=1))
    assert probing.choose(scores, parents, 0.002) == 1  # a probe still verifies a node, so costs stay measured


def test_load_on_big_passes_shrinks_the_budget():
    """Same acceptance evidence, but big passes timed 4x slower than the curve said (a competing
    process): the loaded scheduler verifies fewer nodes than its unloaded twin."""
    scores, parents = chain(64, 0.95)
    idle = AdaptiveTreeScheduler(curve(0.0005), no_probes(decay=0.5))
    loaded = AdaptiveTreeScheduler(curve(0.0005), no_probes(decay=0.5))
    for n in SIZES:
        sent = parents[: max(1, n - 1)]
        seconds = curve(0.0005)(len(sent) + 1)
        for _ in range(5):
            idle.record(sent, scores[: len(sent)], accepted_depth=min(2, len(sent)), verify_seconds=seconds)
            loaded.record(sent, scores[: len(sent)], accepted_depth=min(2, len(sent)), verify_seconds=seconds * (1.0 if n <= 2 else 4.0))
    assert loaded.choose(scores, parents, 0.001) < idle.choose(scores, parents, 0.001)
    assert loaded.verify_seconds(33) > curve(0.0005)(33) * 3


def test_rejections_lower_the_calibration_and_the_budget():
    scores, parents = chain(16, 0.9)
    sched = AdaptiveTreeScheduler(curve(0.001), no_probes())
    before = sched.choose(scores, parents, 0.001)
    for _ in range(30):
        sched.record(parents[:before], scores[:before], accepted_depth=0, verify_seconds=curve(0.001)(before + 1))
    assert sched.calibration(1) < 0.2
    assert sched.choose(scores, parents, 0.001) < before


def test_probes_alternate_half_and_double():
    scores, parents = chain(40, 0.9)
    sched = AdaptiveTreeScheduler(curve(0.001), ScheduleLimits(probe_every=2))
    picks = [sched.choose(scores, parents, 0.001) for _ in range(8)]
    regular = picks[0]
    assert sorted({picks[1], picks[3]}) == [regular // 2, min(40, regular * 2)]
    assert [c.probe for c in sched.history] == [False, True] * 4


def test_tree_helpers():
    parents = [-1, -1, 0, 0, 0, 2]
    assert node_depths(parents) == [1, 1, 2, 2, 2, 3]
    assert tree_shape(parents) == (3, 3)


def test_bad_limits():
    with pytest.raises(ForetellError, match="max_nodes"):
        ScheduleLimits(max_nodes=0)
    with pytest.raises(ForetellError, match="decay"):
        ScheduleLimits(decay=1.0)


def test_scheduled_parallel_head_is_exact_and_adapts(plain):
    target = plain.target.model
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, depth=4))
    sched = AdaptiveTreeScheduler(curve(0.001), ScheduleLimits(max_nodes=24, max_width=3, probe_every=4))
    spec = plain.with_drafter(ParallelHeadDrafter(head, scheduler=sched))
    for prompt in PROMPTS:
        assert spec.engine.generate(prompt, greedy_params()).tokens == plain.engine.generate(prompt, greedy_params()).tokens
    summary = sched.summary()
    assert summary["steps"] == len(sched.history) > 0
    assert all(0 <= c.nodes <= 24 and c.depth <= 4 and c.width <= 3 for c in sched.history)
    assert summary["cost_correction"]  # the engine reported verification timings


def test_scheduled_head_with_a_deep_cache_branch_stays_exact(plain):
    """The result cache's branch can carry the accepted path past the head's depth (a repetitive prompt
    with the prompt indexed): the scheduler must take that report, and greedy stays exact."""
    from dataclasses import replace

    from foretell.result_cache import ResultCache

    target = plain.target.model
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, depth=2))
    sched = AdaptiveTreeScheduler(curve(0.0001), ScheduleLimits(max_nodes=16, probe_every=0))
    engine = replace(plain.with_drafter(ParallelHeadDrafter(head, scheduler=sched)).engine,
                     result_cache=ResultCache(include_prompt=True))
    sched.record([-1, 0], [-0.1, -0.2], accepted_depth=6, verify_seconds=0.01, verified_nodes=9)  # no IndexError
    for prompt in PROMPTS:
        want = plain.engine.generate(prompt, greedy_params()).tokens
        first = engine.generate(prompt, greedy_params())
        assert first.tokens == want
        assert engine.generate(prompt, greedy_params()).tokens == want  # again: the cache now holds deep branches


def test_growth_limits_follow_recent_choices():
    """Before any choice the caps; then twice the largest recent budget (room for the double probe),
    at least 8, and one level past the deepest chosen tree."""
    sched = AdaptiveTreeScheduler(curve(0.001), ScheduleLimits(max_nodes=40, max_depth=6, probe_every=0))
    assert sched.growth_limits() == (40, 6)
    sched.history.append(Choice(nodes=3, depth=2, width=2, expected_tokens=1.5))
    assert sched.growth_limits() == (8, 3)
    sched.history.append(Choice(nodes=12, depth=4, width=3, expected_tokens=2.5))
    assert sched.growth_limits() == (24, 5)
    sched.history.append(Choice(nodes=30, depth=6, width=3, expected_tokens=3.0))
    assert sched.growth_limits() == (40, 6)
    sched.history.append(Choice(nodes=39, depth=6, width=3, expected_tokens=3.0, probe=True))
    assert sched.growth_limits(recent=1) == (40, 6)  # a probe alone says nothing: the caps


def test_a_tree_grown_level_by_level_is_charged_its_levels_drafting():
    """With expensive levels (an EAGLE-3 head's step per depth), a prefix is charged only the levels it reaches:
    the choice is the rate-maximising prefix under that charge, shallower than with the whole drafting time sunk."""
    scores, parents = chain(8, 0.7)
    levels = [0.002 + 0.01 * d for d in range(8)]  # 10 ms a level after the first
    sunk = AdaptiveTreeScheduler(curve(0.001), no_probes()).choose(scores, parents, levels[-1])
    sched = AdaptiveTreeScheduler(curve(0.001), no_probes())
    n = sched.choose(scores, parents, levels[-1], levels)

    def rate(k):
        expected = 1 + sum(math.exp(s) for s in scores[:k])
        return expected / (levels[max(k, 1) - 1] + curve(0.001)(k + 1))

    assert rate(n) == pytest.approx(max(rate(k) for k in range(0, 9)))
    assert n < sunk == 8 and sched.history[-1].depth == n  # a chain: depth = nodes
