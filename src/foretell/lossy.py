"""The verification controller: lossless by default, with a probability shortcut as an opt-in LOSSY mode.

The shortcut skips the target's check of a draft whose draft probability exceeds a threshold
(0.85 in the brief that proposed it; JetSpec itself, whose parallel head foretell implements, verifies every
token). That changes the output distribution (the target never vetoes those tokens), so
foretell only does it when asked (`lossy_threshold`), and says so in the statistics.

Rule: a draft node is *confident* when the product of the drafter's probabilities along its
path from the root (Proposal.draft_prob) exceeds the threshold. Walking down from the root,
the most confident child is accepted without the target's verdict while it stays confident
(path products only fall, so this is a prefix of one path). Below the last confident node
the ordinary lossless verification judges the remaining subtree, and the next token comes
from the target's logits at the last accepted node, as always.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foretell.coupled import Coupling
from foretell.errors import ForetellError
from foretell.tree import children_lists
from foretell.types import Proposal, SamplingParams, Verification
from foretell.verify import LOSSLESS, Verifier, verify


def check_lossy_threshold(threshold) -> float | None:
    """None (lossless) or a number in (0, 1]; 1 never waives anything (no path probability exceeds it)."""
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
        raise ForetellError(
            f"lossy_threshold must be a number in (0, 1] (a draft path probability above it skips the "
            f"target's check), or None for lossless verification; got {threshold!r}"
        )
    return float(threshold)


@dataclass(frozen=True)
class LossyVerifier:
    """The opt-in LOSSY verification strategy (verify.Verifier): verify_controlled with `threshold`."""

    threshold: float

    def check(self, proposal: Proposal, drafter: str) -> None:
        if proposal.size and proposal.draft_prob is None:
            raise ForetellError(
                f"lossy verification needs per-node draft probabilities (Proposal.draft_prob), which the "
                f"{drafter} drafter does not provide; use parallel-head, draft-model, draft-tree or "
                "hidden-state, or leave lossy_threshold off"
            )

    def __call__(self, target_logits: torch.Tensor, proposal: Proposal, params: SamplingParams,
                 generator: torch.Generator | None, coupling: Coupling | None = None) -> Verification:
        return verify_controlled(target_logits, proposal, params, generator, self.threshold, coupling)


def verifier_for(threshold: float | None) -> Verifier:
    """The verification strategy of a (checked) lossy_threshold: lossless verification for None."""
    return LOSSLESS if threshold is None else LossyVerifier(threshold)


def confident_path(proposal: Proposal, threshold: float) -> list[int]:
    """Nodes accepted without the target's check: the confident prefix of the most confident path."""
    probs = proposal.draft_prob.tolist()
    if proposal.is_chain:
        path, value = [], 1.0
        for i, p in enumerate(probs):
            value *= min(float(p), 1.0)
            if not value > threshold:
                break
            path.append(i)
        return path
    children = children_lists(proposal.parents)
    path, node, value = [], -1, 1.0
    while True:
        best = max(children[node + 1], key=lambda c: probs[c], default=None)  # first of ties
        if best is None or not value * min(float(probs[best]), 1.0) > threshold:
            return path
        value *= min(float(probs[best]), 1.0)
        path.append(best)
        node = best


def verify_controlled(
    logits: torch.Tensor,
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
    threshold: float | None,
    coupling: Coupling | None = None,
) -> Verification:
    """The verdict; its `waived` counts the accepted tokens that skipped the target's check. coupling: as verify's;
    the rest below a waived prefix of k tokens is decided k positions later."""
    if threshold is None or not proposal.size:
        return verify(logits, proposal, params, generator, coupling)
    if proposal.draft_prob is None:
        raise ForetellError("lossy verification needs the proposal's draft_prob (per-node draft probabilities)")
    waived = confident_path(proposal, threshold)
    if not waived:
        return verify(logits, proposal, params, generator, coupling)
    later = None if coupling is None else coupling.after(len(waived))
    if proposal.is_chain:
        k = len(waived)
        rest = Proposal(proposal.tokens[k:], None if proposal.q is None else proposal.q[k:])
        verdict = verify(logits[k:], rest, params, generator, later)
        return Verification(k + verdict.accepted, verdict.next_token, waived=k)
    rest, old_index, rows = subtree(proposal, waived[-1])
    verdict = verify(logits[rows.to(logits.device)], rest, params, generator, later)
    path = waived + [old_index[i] for i in verdict.path]
    return Verification(len(path), verdict.next_token, path, waived=len(waived))


def subtree(proposal: Proposal, top: int) -> tuple[Proposal, list[int], torch.Tensor]:
    """The nodes below `top` as a tree of their own (top becomes its root).

    Returns the proposal, its node -> original node map, and the logits rows to verify it with
    (top's slot first, then each node's slot).
    """
    parents = proposal.parents.tolist()
    inside = {top: -1}  # original node -> new index (top -> the new root)
    nodes: list[int] = []
    for i in range(top + 1, len(parents)):  # topological order: parents come first
        if parents[i] in inside:
            inside[i] = len(nodes)
            nodes.append(i)
    index = torch.tensor(nodes, dtype=torch.long)
    sub = Proposal(
        tokens=proposal.tokens[index],
        q=None if proposal.q is None else proposal.q[index],
        parents=torch.tensor([inside[parents[i]] for i in nodes], dtype=torch.long),
    )
    rows = torch.tensor([top + 1] + [i + 1 for i in nodes], dtype=torch.long)
    return sub, nodes, rows

