"""The target's distribution kept as its top-k entries: the soft targets from logits, and KL(p || q) to them.

p is the target's distribution, q a drafter's. KL(p || q) is the divergence whose minimisation raises
the acceptance rate sum_v min(p, q) = 1 - TV(p, q) that speculative decoding gets; every family trains on it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Below this the teacher's tail mass is float32 rounding of 1 - sum(top-k), not probability.
TAIL_EPS = 1e-6


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate at both ends (Maechler's switch at -log 2)."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def topk_kl(student_logits: torch.Tensor, teacher_logp: torch.Tensor, teacher_ids: torch.Tensor) -> torch.Tensor:
    """Per-token KL(p || q) [...] from p's top-k log-probs [..., k] and ids, q's logits [..., V].

    sum over the top-k of p (log p - log q), plus the tail bucket: p_tail (log p_tail - log q_tail)
    with the tails the mass outside the top-k. This is the KL between p and q coarsened to k + 1
    outcomes: a lower bound on the full KL, equal to it when k = V.
    """
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    return coarsened_kl(teacher_logp.exp(), teacher_logp, log_q.gather(-1, teacher_ids))


def coarsened_kl(p_top: torch.Tensor, logp_top: torch.Tensor, log_q_top: torch.Tensor) -> torch.Tensor:
    """KL(p || q) [...] over k listed outcomes [..., k] (p's probabilities and log-probabilities, q's
    log-probabilities) plus one tail bucket holding the mass outside them on either side."""
    head = (p_top * (logp_top - log_q_top)).sum(-1)
    p_tail = (1.0 - p_top.sum(-1)).clamp(min=0.0)
    has_tail = p_tail > TAIL_EPS
    # Keep both logs finite where there is no tail: torch.where would turn an inf there into a nan gradient.
    q_top_mass = torch.logsumexp(log_q_top, dim=-1).clamp(max=-1e-7)
    log_q_tail = log1mexp(torch.where(has_tail, q_top_mass, torch.full_like(q_top_mass, -1.0)))
    safe_p_tail = torch.where(has_tail, p_tail, torch.ones_like(p_tail))
    tail = torch.where(has_tail, p_tail * (safe_p_tail.log() - log_q_tail), torch.zeros_like(p_tail))
    return head + tail


def full_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Exact per-token KL(p || q) [...] from full logits (the check for topk_kl)."""
    log_p = F.log_softmax(teacher_logits.float(), dim=-1)
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def topk_of_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k log-probabilities [..., k], their ids and the log-normaliser [...], in float32."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    top, ids = logits.topk(k, dim=-1)
    return top - lse[..., None], ids, lse
