"""The sizing model's one chooser: how many of a pass's candidate draft nodes are worth verifying.

Every draft-size controller (budget's chain length and tree size, the draft tree's budget, the tree scheduler, the
result cache's branch, the batch budget) orders its candidate nodes, gives each a value (its chance of being
accepted) and keeps the prefix of n nodes with the most expected tokens per second,

    rate(n) = expected(n) / (draft_seconds(n) + verify_seconds(n + 1)),

where expected(n) is `start` (the token every pass yields: 1 for one request, B for a batch of B) plus the first n
values, draft_seconds(n) what drafting that prefix costs, and verify_seconds(rows) a target pass over rows tokens
(the n nodes and the pass's own token). The controllers differ only in the values, those two costs and the
smallest prefix allowed; the formula is written here once. (Issue 75: this module moves into a `sizing/` package.)
"""

from __future__ import annotations

from itertools import accumulate
from typing import Callable, Iterable, NamedTuple, Union

Seconds = Union[float, Callable[[int], float]]  # a constant, or per prefix: seconds(n) for the first n nodes


class Prefix(NamedTuple):
    """The chosen prefix: its node count, expected tokens per second and expected tokens."""

    n: int
    rate: float
    expected: float


def rate(expected: float, draft_seconds: float, verify_seconds: Callable[[int], float], rows: int) -> float:
    """Expected tokens per second of a pass that drafts for draft_seconds and verifies `rows` tokens."""
    return expected / (draft_seconds + verify_seconds(rows))


def best_prefix(values: Iterable[float], draft_seconds: Seconds, verify_seconds: Callable[[int], float],
                min_size: int = 0, start: float = 1.0) -> Prefix:
    """The prefix of `values` (per node, in the order nodes may be kept: best first, parents before children) with
    the highest rate; expected(n) is the running sum start + values[0] + ... + values[n - 1]. See best_of_prefixes
    for min_size and ties."""
    return best_of_prefixes(accumulate(values, initial=start), draft_seconds, verify_seconds, min_size)


def best_of_prefixes(expected: Iterable[float], draft_seconds: Seconds, verify_seconds: Callable[[int], float],
                     min_size: int = 0) -> Prefix:
    """best_prefix given each prefix's expected tokens directly: expected[n] for n = 0, 1, ... nodes.

    Prefixes from min_size up are candidates (min_size = 0: verifying no draft, a plain pass, is one). Ties keep the
    smaller prefix: a later prefix must have a strictly higher rate. Where there are fewer values than min_size the
    answer is min_size nodes, its rate and expected tokens counting the values there are."""
    draft = draft_seconds if callable(draft_seconds) else (lambda n: draft_seconds)
    expected = list(expected)
    best: Prefix | None = None
    for n in range(min_size, len(expected)):
        r = rate(expected[n], draft(n), verify_seconds, n + 1)
        if best is None or r > best.rate:
            best = Prefix(n, r, expected[n])
    if best is None:
        e = expected[min(min_size, len(expected) - 1)]
        best = Prefix(min_size, rate(e, draft(min_size), verify_seconds, min_size + 1), e)
    return best
