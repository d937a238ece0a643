"""Verification of a draft chain against the target's distributions (p = target, q = draft).

Greedy: accept the longest prefix of drafts equal to the target's argmax, then take the
target's argmax at the first mismatch (or after the last draft: the bonus token).

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), lossless at any temperature:
for draft i with token x, accept with probability min(1, p_i(x) / q_i(x)). At the first
rejection emit a *recovered* token sampled from norm(max(0, p_i - q_i)) and stop. If all n
drafts pass, emit a *bonus* token sampled from p_n. Every emitted token is then distributed
exactly as the target would have sampled it. A deterministic drafter has q = one-hot(x), so
acceptance is p_i(x) and the residual is p_i with x removed.
"""

from __future__ import annotations

import torch

from foretell.sampling import processed_probs, sample
from foretell.types import Proposal, SamplingParams, Verification


def verify_greedy(target_logits: torch.Tensor, proposal: Proposal) -> Verification:
    """target_logits: [n + 1, V], row i scores the token after draft i (row 0: after the last committed token)."""
    best = target_logits.argmax(-1)  # [n + 1]
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
        x = proposal.tokens.to(p.device)
        p_x = p[torch.arange(n, device=p.device), x].tolist()
        q_x = [1.0] * n if proposal.q is None else proposal.q[torch.arange(n), proposal.tokens].tolist()
        u = torch.rand(n, generator=generator, device=generator.device if generator else "cpu").tolist()
    for i, token in enumerate(tokens):
        if u[i] * q_x[i] < p_x[i]:  # u < p/q without dividing by a tiny q
            continue
        q_i = None if proposal.q is None else proposal.q[i].to(p.device)
        return Verification(i, sample(residual(p[i], q_i, token), generator))
    return Verification(n, sample(p[n], generator))


def verify_chain(
    target_logits: torch.Tensor,
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Verification:
    if params.greedy:
        return verify_greedy(target_logits, proposal)
    return verify_sampled(target_logits, proposal, params, generator)
