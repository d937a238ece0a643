"""Distillation losses from a cached top-k teacher, and AdaSPEC's selective token filter.

p is the target's distribution (known through its top-k entries), q the student's (draft or
reference). KL(p || q) is the divergence whose minimisation raises the acceptance rate
sum_v min(p, q) = 1 - TV(p, q) that speculative decoding gets.
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
    log_q_top = log_q.gather(-1, teacher_ids)
    p_top = teacher_logp.exp()
    head = (p_top * (teacher_logp - log_q_top)).sum(-1)
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


def keep_count(num_valid: int, fraction: float) -> int:
    """How many tokens the filter keeps: the nearest integer to fraction * valid, at least one."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"the selected fraction must be in (0, 1], got {fraction}")
    return max(1, min(num_valid, math.floor(fraction * num_valid + 0.5))) if num_valid else 0


def select_tokens(delta: torch.Tensor, valid: torch.Tensor, fraction: float) -> torch.Tensor:
    """AdaSPEC's filter: among valid tokens, the `fraction` with the largest delta (bool, delta's shape).

    delta = KL(p||q_draft) - KL(p||q_ref): large where the draft lags behind what a model of its
    size can reach, i.e. where training still pays; small or negative on tokens too hard for it.
    The threshold is recomputed from every (micro-)batch, so it follows the draft as it learns;
    per micro-batch also makes N data-parallel processes select what one process would.
    """
    flat = torch.where(valid, delta, torch.full_like(delta, -math.inf)).flatten()
    n = keep_count(int(valid.sum()), fraction)
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[flat.topk(n).indices] = True
    return mask.view(delta.shape) & valid


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def distill_loss(student_logits, teacher_logp, teacher_ids, valid) -> tuple[torch.Tensor, dict]:
    """Plain (DistillSpec-style) distillation: mean KL(p || q) over every valid token."""
    kl = topk_kl(student_logits, teacher_logp, teacher_ids)
    loss = masked_mean(kl, valid)
    return loss, {"kl": loss.item()}


def adaspec_loss(student_logits, teacher_logp, teacher_ids, ref_kl, valid, fraction: float) -> tuple[torch.Tensor, dict]:
    """Mean KL(p || q_draft) over the tokens `select_tokens` keeps; also reports the all-token KL."""
    kl = topk_kl(student_logits, teacher_logp, teacher_ids)
    keep = select_tokens(kl.detach() - ref_kl, valid, fraction)
    loss = masked_mean(kl, keep)
    return loss, {"kl": masked_mean(kl.detach(), valid).item(), "kl_selected": loss.item(), "selected": int(keep.sum())}


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy on valid positions (fine-tuning the target on the task data)."""
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), input_ids[:, 1:].flatten(), reduction="none")
    loss = masked_mean(nll.view(input_ids.shape[0], -1), valid[:, :-1])
    return loss, {"nll": loss.item()}
