"""Per-depth acceptance of an EAGLE-3 head on held-out text, teacher-forced (as parallel_head/eval.py).

At every anchor a of a held-out sequence the head has seen the true prefix and unrolls `depth` steps
along the true tokens; depth d predicts token a + d + 1. Per depth: top-1 (the head's best token, mapped
from its draft vocabulary, is the target's greedy token), the expected acceptance of lossless speculative
sampling at temperature 1, sum_v min(p, q) (q is zero outside the draft vocabulary), and the chain rate.
Also the share of held-out assistant tokens the draft vocabulary contains.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from foretell.models.eagle3 import Eagle3Head
from foretell.models.transformer import Transformer
from foretell.train.common.data import TokenData
from foretell.train.common.depths import anchor_candidates, valid_depths

ANCHOR_CHUNK = 64  # anchors per head forward (bounds the [A, D, V] probabilities)


@torch.no_grad()
def eagle3_depth_eval(target: Transformer, head: Eagle3Head, data: TokenData, depth: int) -> dict:
    """{"depth", "top1", "expected_acceptance", "chain_top1", "anchors", "sequences", "draft_vocab_coverage"}."""
    top1, expected, chain, count = (torch.zeros(depth) for _ in range(4))
    was_training = head.training
    head.eval()
    vocab_ids = head.vocab_ids.cpu()
    covered = total = 0
    for ids, mask in tqdm(zip(data.input_ids, data.loss_mask), total=len(data), desc="per-depth acceptance", unit="seq"):
        drafted = ids[1:][mask[:-1]]
        covered += int(head.t2d.cpu()[drafted].sum())
        total += len(drafted)
        anchors = anchor_candidates(mask)
        if len(anchors) == 0:
            continue
        out = target.forward_sequences(ids[None].to(target.device), hidden_layers=head.config.aux_layers)
        features, p_logits = head.features(out.hidden), out.logits[0].float().cpu()
        for chunk in anchors.split(ANCHOR_CHUNK):
            rows = int(chunk.max()) + 1
            states = head.forward_training(features[:, :rows], ids[None].to(head.device), chunk, depth)[0]
            q_draft = torch.softmax(head.logits(states).cpu(), -1)  # [A, D, V_draft]
            q = q_draft.new_zeros(*q_draft.shape[:-1], head.config.vocab_size)
            q[..., vocab_ids] = q_draft
            at = (chunk[:, None] + torch.arange(1, depth + 1)).clamp(max=len(ids) - 1)
            p = torch.softmax(p_logits[at], -1)
            valid = valid_depths(mask, chunk, depth)
            match = q.argmax(-1) == p.argmax(-1)
            top1 += (match & valid).sum(0)
            expected += (torch.minimum(p, q).sum(-1) * valid).sum(0)
            chain += (match.cummin(dim=1).values & valid).sum(0)
            count += valid.sum(0)
    head.train(was_training)
    per = count.clamp(min=1)
    return {"depth": list(range(1, depth + 1)), "top1": (top1 / per).tolist(), "expected_acceptance": (expected / per).tolist(),
            "chain_top1": (chain / per).tolist(), "anchors": count.int().tolist(), "sequences": len(data),
            "draft_vocab_coverage": covered / max(total, 1)}
