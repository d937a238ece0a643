"""Verification of a draft chain against the target's distributions (p = target, q = draft).

Greedy: accept the longest prefix of drafts equal to the target's argmax, then take the
target's argmax at the first mismatch (or after the last draft: the bonus token).

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), lossless at any temperature:
for draft i with token x, accept with probability min(1, p_i(x) / q_i(x)). At the first
rejection emit a *recovered* token sampled from norm(max(0, p_i - q_i)) and stop. If all n
drafts pass, emit a *bonus* token sampled from p_n. Every emitted token is then distributed
exactly as the target would have sampled it. A deterministic drafter has q = one-hot(x), so
acceptance is p_i(x) and the residual is p_i with x removed.

Trees (SpecInfer, Miao et al. 2023): at a node, try its children in turn. A child x sampled
from q is accepted with probability min(1, p(x) / q(x)); on rejection p <- norm(max(0, p - q))
before the next sibling is tried. Deterministic children (top-k, EAGLE) are point masses, so
this becomes: accept x with probability p(x), else zero p(x), renormalise, try the next
sibling. An accepted child becomes the node; when every child fails, the target token is
sampled from the current (residual) p; at a leaf it is the bonus token from p.

With a Coupling (coupled.py, the default for seeded requests) sampled verification is greedy-like
instead: each position's token is the target's Gumbel-max token under noise keyed on (seed, position).
"""

from __future__ import annotations

from typing import Protocol

import torch

from foretell.coupled import Coupling, verify_coupled
from foretell.sampling import greedy_tokens, processed_probs, sample
from foretell.tree import children_lists
from foretell.types import Proposal, SamplingParams, Verification


def verify_greedy(target_logits: torch.Tensor, proposal: Proposal) -> Verification:
    """target_logits: [n + 1, V], row i scores the token after draft i (row 0: after the last committed token)."""
    best = greedy_tokens(target_logits)  # [n + 1]
    n = proposal.size
    if n == 0:
        return Verification(0, int(best[0]))
    matches = (proposal.tokens.to(best.device) == best[:n]).int().cumprod(0)
    accepted = int(matches.sum())
    return Verification(accepted, int(best[accepted]))


def residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """norm(max(0, p - q)) for one position; q None means one-hot on `token`."""
    if q is None:
        r = p.clone()
        r[token] = 0.0
    else:
        r = (p - q).clamp_min(0.0)
    total = r.sum()
    # Zero mass only when p <= q everywhere, i.e. p == q, where rejection cannot happen;
    # guard against rounding anyway.
    return r / total if total > 0 else p


def verify_sampled(
    target_logits: torch.Tensor,
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Verification:
    p = processed_probs(target_logits, params)  # [n + 1, V]
    tokens = proposal.tokens.tolist()
    n = len(tokens)
    if n:
        idx = torch.arange(n)
        p_x = p[idx.to(p.device), proposal.tokens.to(p.device)].tolist()
        q_x = [1.0] * n if proposal.q is None else proposal.q[idx, proposal.tokens].tolist()
    for i, token in enumerate(tokens):
        # One uniform per judged draft, the same stream the tree verifier consumes.
        if uniform(generator) * q_x[i] < p_x[i]:  # u < p/q without dividing by a tiny q
            continue
        q_i = None if proposal.q is None else proposal.q[i].to(p.device)
        return Verification(i, sample(residual(p[i], q_i, token), generator))
    return Verification(n, sample(p[n], generator))


def uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator, device=generator.device if generator else "cpu"))


def verify_chain(
    target_logits: torch.Tensor,
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Verification:
    if params.greedy:
        return verify_greedy(target_logits, proposal)
    return verify_sampled(target_logits, proposal, params, generator)


def verify_tree_greedy(target_logits: torch.Tensor, proposal: Proposal) -> Verification:
    """target_logits: [N + 1, V] for slots root, node 0 .. node N-1. Follow the argmax down the tree."""
    best = greedy_tokens(target_logits).tolist()
    tokens = proposal.tokens.tolist()
    children = children_lists(proposal.parents)
    path: list[int] = []
    node = -1
    while True:
        want = best[node + 1]
        match = next((c for c in children[node + 1] if tokens[c] == want), None)
        if match is None:
            return Verification(len(path), want, path)
        path.append(match)
        node = match


def verify_tree_sampled(
    target_logits: torch.Tensor,
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Verification:
    p_all = processed_probs(target_logits, params)  # [N + 1, V]
    tokens = proposal.tokens.tolist()
    children = children_lists(proposal.parents)
    path: list[int] = []
    node = -1
    while True:
        p = p_all[node + 1]
        chosen = None
        for child in children[node + 1]:
            x = tokens[child]
            q = None if proposal.q is None else proposal.q[child].to(p.device)
            q_x = 1.0 if q is None else float(q[x])
            if uniform(generator) * q_x < float(p[x]):
                chosen = child
                break
            p = residual(p, q, x)
        if chosen is None:
            return Verification(len(path), sample(p, generator), path)
        path.append(chosen)
        node = chosen


def verify(
    target_logits: torch.Tensor,
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
    coupling: Coupling | None = None,
) -> Verification:
    """Verify a chain or a tree proposal (see the module docstring for the rules); sampled decoding follows the
    coupled rule when `coupling` is given, else speculative sampling's with `generator`."""
    if coupling is not None and not params.greedy:
        return verify_coupled(target_logits, proposal, params, coupling)
    if proposal.is_chain:
        return verify_chain(target_logits, proposal, params, generator)
    if params.greedy:
        return verify_tree_greedy(target_logits, proposal)
    return verify_tree_sampled(target_logits, proposal, params, generator)


class Verifier(Protocol):
    """How the target judges a pass's proposal: LOSSLESS (`verify`, the default) or an opt-in strategy
    (lossy.LossyVerifier). The engine holds one; decoding verifies through it and nothing else."""

    threshold: float | None  # reported in the statistics (lossy.py's threshold; None: lossless)

    def check(self, proposal: Proposal, drafter: str) -> None:
        """Refuse (ForetellError) a proposal of `drafter` this strategy cannot judge, before the target pass."""

    def __call__(self, target_logits: torch.Tensor, proposal: Proposal, params: SamplingParams,
                 generator: torch.Generator | None, coupling: Coupling | None = None) -> Verification:
        """The verdict on `proposal` from the target pass's logits (as `verify`'s arguments)."""


class LosslessVerifier:
    """`verify`: the output is exactly the target's (greedy) or distributed exactly as the target's (sampled)."""

    threshold = None

    def check(self, proposal: Proposal, drafter: str) -> None:
        pass

    def __call__(self, target_logits: torch.Tensor, proposal: Proposal, params: SamplingParams,
                 generator: torch.Generator | None, coupling: Coupling | None = None) -> Verification:
        return verify(target_logits, proposal, params, generator, coupling)


LOSSLESS = LosslessVerifier()
