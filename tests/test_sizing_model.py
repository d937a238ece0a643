"""The sizing model's one chooser (sizing/chooser.best_prefix): the best prefix of node values given draft and verify
costs, with its ties, per-prefix draft costs and min_size."""

from __future__ import annotations

import random

import pytest

from foretell.sizing.chooser import Prefix, best_of_prefixes, best_prefix, rate


def flat(rows: int) -> float:
    return 1.0  # every pass costs the same: more value always pays


def linear(rows: int) -> float:
    return float(rows)  # each row costs as much as the first


def brute_force(values, draft, verify, start=1.0, min_size=0):
    """The first n (from min_size) with the highest rate of start + the first n values."""
    rates = [rate(start + sum(values[:n]), draft(n), verify, n + 1) for n in range(min_size, len(values) + 1)]
    return min_size + rates.index(max(rates))


def test_rate_is_expected_over_draft_plus_verify():
    assert rate(3.0, 0.5, linear, 2) == 3.0 / 2.5


def test_more_value_pays_on_a_flat_curve_and_costs_on_a_steep_one():
    values = [0.9, 0.8, 0.5, 0.1]
    assert best_prefix(values, 0.0, flat).n == 4
    assert best_prefix(values, 0.0, linear).n == 0  # each row costs a pass: no node is worth one
    # Half a pass a row: 1 / 1, 1.9 / 1.5, 2.7 / 2, 3.2 / 2.5, 3.3 / 3; the second node still pays, the third not.
    chosen = best_prefix(values, 0.0, lambda rows: 1.0 + 0.5 * (rows - 1))
    assert chosen.n == 2 and chosen.rate == pytest.approx(1.35) and chosen.expected == pytest.approx(2.7)


def test_n_zero_is_a_candidate_unless_min_size_excludes_it():
    assert best_prefix([0.05], 0.5, linear).n == 0  # 1 / 1.5 beats 1.05 / 2.5: a plain pass
    assert best_prefix([0.05], 0.5, linear, min_size=1).n == 1


def test_ties_keep_the_smaller_prefix():
    # Prefix 0: 1 / 1; prefix 1: 2 / 2; prefix 2: 3 / 3. All equal: the plain pass stays.
    assert best_prefix([1.0, 1.0], 0.0, linear) == Prefix(0, 1.0, 1.0)
    # From min_size 1 the tie between 1 and 2 keeps 1.
    assert best_prefix([1.0, 1.0], 0.0, linear, min_size=1).n == 1
    # A later strictly better prefix does win.
    assert best_prefix([1.0, 1.5], 0.0, linear).n == 2


def test_per_prefix_draft_cost():
    values = [0.9, 0.9, 0.9]
    level = [0.0, 1.0, 1.0, 5.0]  # the third node reaches a level that costs much more to draft
    chosen = best_prefix(values, level.__getitem__, flat)
    assert chosen.n == 2 and chosen.rate == pytest.approx(2.8 / 2.0)
    assert best_prefix(values, 1.0, flat).n == 3  # charged one constant, the deepest prefix pays


def test_start_counts_tokens_without_drafts():
    # A batch of 4 (start 4): one more row costs a quarter more, a 0.2 node does not pay, a 0.5 node does.
    verify = lambda rows: 1.0 + 0.25 * (rows - 1)  # noqa: E731
    assert best_prefix([0.2], 0.0, verify, start=4.0).n == 0
    assert best_prefix([0.5], 0.0, verify, start=4.0).n == 0  # 4.5 / 1.25 = 3.6 < 4
    assert best_prefix([1.5], 0.0, verify, start=4.0).n == 1  # 5.5 / 1.25 = 4.4


def test_too_few_values_and_best_tree_size():
    from foretell.sizing.tree import best_tree_size

    # best_tree_size's candidates start at one node, whatever their rate.
    assert best_tree_size([0.9, 0.01], linear, 0.0, min_size=1) == 1
    assert best_tree_size([], linear, 0.5, min_size=1) == 1
    # Fewer values than min_size: min_size, its rate counting the values there are.
    assert best_prefix([0.5], 0.0, linear, min_size=3) == Prefix(3, 1.5 / 4.0, 1.5)
    assert best_prefix([], 0.5, linear, min_size=1) == Prefix(1, 1.0 / 2.5, 1.0)


def test_best_of_prefixes_takes_expected_tokens_directly():
    expected = [2.0, 2.5, 2.6]
    assert best_of_prefixes(expected, 0.0, linear) == Prefix(0, 2.0, 2.0)
    assert best_of_prefixes(expected, 0.0, flat).n == 2


def test_agrees_with_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        values = sorted((rng.random() for _ in range(rng.randrange(0, 12))), reverse=True)
        slope, step, min_size = rng.uniform(0.0, 0.5), rng.uniform(0.0, 0.3), rng.randrange(0, 2)
        if min_size > len(values):
            continue
        verify = lambda rows: 1.0 + slope * rows  # noqa: E731
        draft = lambda n: step * n  # noqa: E731
        chosen = best_prefix(values, draft, verify, min_size=min_size)
        assert chosen.n == brute_force(values, draft, verify, min_size=min_size)
