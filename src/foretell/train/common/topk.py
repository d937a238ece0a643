"""The target's distribution kept as its top-k entries: the soft targets from logits, and KL(p || q) to them.

p is the target's distribution, q a drafter's. KL(p || q) is the divergence whose minimisation raises
the acceptance rate sum_v min(p, q) = 1 - TV(p, q) that speculative decoding gets; every family trains on it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from foretell.runtime.wide_linear import wide_rows_of

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


# Rows projected to the vocabulary at a time by sequence_topk: a 4 x 320-token batch's whole logits are ~250 MB
# for SmolLM2's 49K vocabulary (twice, bf16 and float32) and ~1.2 GB for Qwen's 152K; 128-row slices stay in the
# CPU's cache (SmolLM2's feature pass ~5% faster on 2 AVX2 cores), and every row's numbers are the same.
LOGIT_ROWS = 128


@torch.no_grad()
def sequence_topk(target, input_ids: torch.Tensor, k: int, hidden_layers: tuple[int, ...] = ()
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """A frozen target's top-k log-probabilities [B, T, k], their ids, the log-normaliser [B, T] (float32) and the
    hidden states of `hidden_layers` over a batch of sequences [B, T], from one forward."""
    final = len(target.layers)  # the final-normed states: what the output layer projects
    out = target.forward_sequences(input_ids.to(target.device), hidden_layers=(*hidden_layers, final),
                                   with_logits=False)
    normed = out.hidden[final].reshape(-1, out.hidden[final].shape[-1])
    # a slice runs the product the whole batch would: a bf16 target's fp32 one from its WideLinear threshold up
    step = max(LOGIT_ROWS, wide_rows_of(target))
    bounds = [*range(0, len(normed), step), len(normed)]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < step:  # a short last slice joins the one before it
        del bounds[-2]
    parts = [topk_of_logits(target.project(normed[a:b]), k) for a, b in zip(bounds, bounds[1:])]
    shape = input_ids.shape
    logp, ids, lse = (torch.cat([part[j] for part in parts]) for j in range(3))
    hidden = {layer: out.hidden[layer] for layer in hidden_layers}
    return logp.view(*shape, -1), ids.view(*shape, -1), lse.view(shape), hidden


def topk_of_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k log-probabilities [..., k], their ids and the log-normaliser [...], in float32."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    top, ids = logits.topk(k, dim=-1)
    return top - lse[..., None], ids, lse
