"""Anchors and depths: which (anchor, depth) pairs a drafter trained on cached features learns and is judged on.

For a sequence, anchor a is a context row: the drafter has seen the target's rows 0..a, and its
depth-d prediction is the token a + d + 1. A pair is trained (and evaluated) where that token is an
assistant token. Anchors are sampled as a pure function of (seed, step, sequence), so a resumed run
repeats the uninterrupted one exactly. Parallel-head and hidden-state training share all of this,
and report the same per-depth table.
"""

from __future__ import annotations

import torch


def valid_depths(loss_mask: torch.Tensor, anchors: torch.Tensor, depth: int) -> torch.Tensor:
    """[A, D] bool: depth d of anchor a is trained where token a + d + 1 is an assistant token."""
    at = anchors[:, None] + torch.arange(1, depth + 1)
    return loss_mask[at.clamp(max=len(loss_mask) - 1)] & (at < len(loss_mask))


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Context rows whose depth-1 token is trained (a context row needs its next token: a <= T - 2)."""
    return torch.nonzero(loss_mask[1:]).flatten()


def sample_anchors(loss_mask: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """Up to `count` distinct anchors, ascending, drawn by a generator seeded with `seed`."""
    candidates = anchor_candidates(loss_mask)
    if len(candidates) > count:
        pick = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))[:count]
        candidates = candidates[pick.sort().values]
    return candidates


def anchor_seed(seed: int, step: int, sequence: int) -> int:
    return (seed * 1_000_003 + step) * 1_000_033 + sequence


def format_depth_table(result: dict) -> str:
    lines = ["| depth | top-1 = target greedy | expected acceptance sum min(p, q) | chain top-1 (depths 1..d) | anchors |",
             "|---:|---:|---:|---:|---:|"]
    for i, d in enumerate(result["depth"]):
        lines.append(f"| {d} | {result['top1'][i]:.3f} | {result['expected_acceptance'][i]:.3f} | "
                     f"{result['chain_top1'][i]:.3f} | {result['anchors'][i]} |")
    return "\n".join(lines)
