"""Per-depth acceptance of a parallel head on held-out text, teacher-forced.

At every anchor a of a held-out sequence (a context row whose next-next token is an assistant
token) and every depth d whose token a + d + 1 is one too: does the head's top-1 at depth d equal
the target's greedy token there, given the true prefix? Also the expected acceptance of lossless
speculative sampling at temperature 1, sum_v min(p, q_d), and the chain rate: top-1 right at
every depth 1..d (what a greedy chain drafter would get accepted, on this text). The table of
these is common/depths.py's format_depth_table.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from foretell.models.parallel_head import ParallelHead
from foretell.models.transformer import Transformer
from foretell.train.common.data import TokenData
from foretell.train.common.depths import anchor_candidates, valid_depths

ANCHOR_CHUNK = 64  # anchors per head forward (bounds the [A, D, V] logits)


@torch.no_grad()
def depth_acceptance(target: Transformer, head: ParallelHead, data: TokenData) -> dict:
    """{"depth": [1..D], "top1": [...], "expected_acceptance": [...], "chain_top1": [...], "anchors": [...]}."""
    D = head.config.depth
    top1, expected, chain, count = torch.zeros(D), torch.zeros(D), torch.zeros(D), torch.zeros(D)
    was_training = head.training
    head.eval()
    for ids, mask in tqdm(zip(data.input_ids, data.loss_mask), total=len(data), desc="per-depth acceptance", unit="seq"):
        anchors = anchor_candidates(mask)
        if len(anchors) == 0:
            continue
        out = target.forward_sequences(ids[None].to(target.device), hidden_layers=head.config.fuse_layers)
        features, p_logits = head.features(out.hidden)[0], out.logits[0].float().cpu()
        for chunk in anchors.split(ANCHOR_CHUNK):
            rows = int(chunk.max()) + 1
            q_logits = head.forward_training(features[None, :rows], ids[None, 1 : rows + 1].to(head.device),
                                             chunk.tolist())[0].float().cpu()
            at = (chunk[:, None] + torch.arange(1, D + 1)).clamp(max=len(ids) - 1)
            p = torch.softmax(p_logits[at], -1)
            valid = valid_depths(mask, chunk, D)
            match = q_logits.argmax(-1) == p.argmax(-1)
            top1 += (match & valid).sum(0)
            expected += (torch.minimum(p, torch.softmax(q_logits, -1)).sum(-1) * valid).sum(0)
            chain += (match.cummin(dim=1).values & valid).sum(0)
            count += valid.sum(0)
    head.train(was_training)
    per = count.clamp(min=1)
    return {"depth": list(range(1, D + 1)), "top1": (top1 / per).tolist(), "expected_acceptance": (expected / per).tolist(),
            "chain_top1": (chain / per).tolist(), "anchors": count.int().tolist(), "sequences": len(data)}
