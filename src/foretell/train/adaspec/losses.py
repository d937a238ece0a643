"""AdaSPEC's losses: plain distillation, the selective token filter, and fine-tuning cross-entropy.

p is the target's distribution (known through its top-k entries), q the student's (draft or
reference); the per-token KL(p || q) they build on is common/topk.py's topk_kl.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from foretell.train.common.topk import topk_kl


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
