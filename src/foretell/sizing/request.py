"""Draft sizing: how many draft tokens each pass of a request verifies, as one object per request.

Each request's decoding (decoding.py) holds one DraftSizer, made fresh for it when it starts (SizingPolicies.new_sizer),
and asks it, and nothing else, how much to draft:

    draft_tokens(room, limit) -> n         before drafting: draft tokens (a tree drafter: its depth cap)
    should_draft(matched) -> bool          run the drafter at all, beside the result cache's branch
    branch_tokens(branch, nodes, seconds)  after drafting: how much of that branch rides along
    record(outcome)                        after verification: what the pass did

RequestSizer is the implementation; the controllers it is made of are its parts, each optional:
  - the length policy (sizing/chain.py) sizes a chain drafter's drafts;
    the engine's policy is the configuration, and each request decodes with a copy of it;
  - the adaptive tree scheduler (sizing/tree.py) sizes a tree drafter's trees; the drafter grows and
    trims them by a schedule made fresh by its start (Drafter.schedule), which the sizer shares for the branch;
  - the draft gate (sizing/gate.py) decides whether the drafter runs; its token estimates restart with each
    request, its timings carry over;
  - the result cache's branch sizer (result_cache.BranchSizer) trims the cache's branch by the tree schedule's
    cost curve; it measures the cache, which spans requests by design.
What the text does (acceptance, calibration, probe counts, choices) starts afresh with each request; what the
machine does (measured timings, cost corrections) carries over. A batch's budget (sizing/batch.py) is the room of
a pass: its pre-draft cap is draft_tokens' `limit`, its post-draft cap Decoding.keep.

Sizing only picks which drafts the target verifies, never how it verifies them: output is lossless whatever
the sizer says.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from foretell.sizing.gate import DraftGate
    from foretell.drafters.base import Drafter
    from foretell.sizing.chain import DraftLengthPolicy
    from foretell.sizing.tree import AdaptiveTreeScheduler
    from foretell.sizing.branch import BranchSizer


@dataclass(frozen=True)
class PassOutcome:
    """What one decode pass did, for the sizer to learn from."""

    planned: int  # draft tokens the pass was allowed (0: no drafting considered)
    drafted: bool  # the drafter ran (the gate may skip it)
    matched: int  # the length of the result cache's n-gram key behind its branch (0: no branch)
    size: int  # draft nodes verified (the drafter's and the branch's)
    depth: int  # the verified proposal's depth
    accepted: int  # draft tokens accepted
    seconds: float  # from planning to the verdict
    without_drafter: int  # tokens the pass would have committed without the drafter: 1 + the branch's accepted prefix
    branch_nodes: int = 0  # nodes only the result cache's branch proposed
    branch_accepted: int = 0  # of those, the ones on the accepted path


class DraftSizer(Protocol):
    """One request's draft-size policy; decoding consults nothing else about sizes."""

    def draft_tokens(self, room: int, limit: int | None = None) -> int:
        """Draft tokens for this pass (a tree drafter: its depth cap; 0: none); room: tokens the request may still
        add (the pass adds one beyond its drafts); limit: the batch's cap before drafting (None: none)."""

    def should_draft(self, matched: int) -> bool:
        """Run the drafter this pass? matched: the n-gram length behind the result cache's branch (0: none)."""

    def branch_tokens(self, branch: int, tree_nodes: int, draft_seconds: float) -> int:
        """Of a result-cache branch of `branch` tokens, how many to verify beside the drafter's tree_nodes
        (draft_seconds: already spent drafting)."""

    def branch_acceptance(self) -> float:
        """The chance a result-cache branch token is accepted where its parent was (measured; 0.5 unmeasured)."""

    def record(self, outcome: PassOutcome) -> None:
        """One pass's outcome."""


@dataclass
class RequestSizer:
    """The DraftSizer every engine makes (new_request_sizer): a chain's length policy or a tree drafter's own sizing,
    the optional draft gate and branch sizer."""

    drafting: bool  # a drafter is configured
    max_draft: int  # a chain's cap, whatever its policy asks
    length: DraftLengthPolicy | None = None  # a chain drafter's (this request's copy); None: the drafter sizes itself
    tree: AdaptiveTreeScheduler | None = None  # the tree drafter's schedule for this request (None: a fixed shape)
    gate: DraftGate | None = None
    branch: BranchSizer | None = None

    def draft_tokens(self, room: int, limit: int | None = None) -> int:
        if not self.drafting:
            n = 0
        elif self.length is None:  # a tree drafter: depth within the token limit, its size its own
            n = room - 1
        else:
            n = min(self.length.next_length(), self.max_draft, room - 1)
        return n if limit is None else min(n, limit)

    def should_draft(self, matched: int) -> bool:
        return self.gate is None or self.gate.should_draft(matched)

    def branch_tokens(self, branch: int, tree_nodes: int, draft_seconds: float) -> int:
        """Trimmed to what pays by the tree schedule's cost curve and its latest choice; whole without a schedule
        (or a choice yet) and on the schedule's probes, so the branch's acceptance stays measured."""
        last = self.tree.last_choice if self.tree is not None else None
        if self.branch is None or last is None or last.probe:
            return branch
        return self.branch.size(branch, tree_nodes, last.expected_tokens, self.tree.verify_seconds, draft_seconds)

    def branch_acceptance(self) -> float:
        return self.branch.acceptance if self.branch is not None else 0.5

    def record(self, outcome: PassOutcome) -> None:
        if self.gate is not None and outcome.planned > 0:
            self.gate.record(outcome.matched, outcome.drafted, 1 + outcome.accepted, outcome.seconds,
                             outcome.without_drafter)
        if not outcome.size:
            return
        if self.length is not None:
            self.length.update(outcome.depth, outcome.accepted)
        if self.branch is not None and outcome.branch_nodes:
            self.branch.record(outcome.branch_nodes, outcome.branch_accepted)


def new_request_sizer(drafter: Drafter | None, length_policy: DraftLengthPolicy, max_draft: int,
                      gate: DraftGate | None = None, branch: BranchSizer | None = None) -> RequestSizer:
    """A request's sizer from an engine's configuration; call it after the drafter's start (its schedule is this
    request's). The length policy is copied, the gate told a request begins."""
    if gate is not None:
        gate.begin()
    if drafter is None:
        return RequestSizer(False, max_draft, gate=gate, branch=branch)
    length = None if drafter.sizes_itself else copy.deepcopy(length_policy)
    return RequestSizer(True, max_draft, length, drafter.schedule, gate, branch)


@dataclass(frozen=True)
class SizingPolicies:
    """An engine's sizing configuration, from which each request's sizer is made fresh (new_sizer)."""

    length_policy: DraftLengthPolicy
    max_draft: int
    gate: DraftGate | None = None
    branch: BranchSizer | None = None

    def new_sizer(self, drafter: Drafter | None) -> RequestSizer:
        """This request's sizer; call it after the drafter's start."""
        return new_request_sizer(drafter, self.length_policy, self.max_draft, self.gate, self.branch)
