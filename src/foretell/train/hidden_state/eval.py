"""Held-out evaluation of a hidden-state draft: per-depth hidden MSE and acceptance; hot-vocab coverage.

Teacher-forced like parallel_head/eval.py: at every anchor t of a held-out sequence the draft has seen the
target's states 0..t and unrolls `depth` steps on its own predictions; depth d = j + 1 predicts the
state at p = t + d and, through lm_head + E(x_p), the token p + 1. Per depth: the hidden MSE
against the target's state at p (the paper's check: < 0.1), top-1 = the target's greedy token,
top-`width` (the target's greedy token among the children the tree offers), the expected
acceptance sum min(p, q) and the chain rate (top-1 right at every depth 1..d).
"""

from __future__ import annotations

from collections import Counter

import torch
from tqdm import tqdm

from foretell.hot_vocab import hot_vocab_from_counts
from foretell.models.hidden_draft import HiddenDraft
from foretell.models.transformer import Transformer
from foretell.train.common.data import TokenData
from foretell.train.common.depths import format_depth_table, valid_depths
from foretell.train.hidden_state.loss import draft_logits, unroll

ANCHOR_CHUNK = 64  # anchors per output-layer pass (bounds the [A, depth, V] logits)


@torch.no_grad()
def hidden_depth_eval(target: Transformer, draft: HiddenDraft, data: TokenData, depth: int, width: int = 3) -> dict:
    names = ("mse", "top1", f"top{width}", "expected_acceptance", "chain_top1")
    sums = {name: torch.zeros(depth) for name in names}
    count = torch.zeros(depth)
    was_training = draft.training
    draft.eval()
    layer = draft.target_layer
    for ids, mask in tqdm(zip(data.input_ids, data.loss_mask), total=len(data), desc="held-out eval", unit="seq"):
        T = len(ids)
        out = target.forward_sequences(ids[None].to(target.device), hidden_layers=(layer,))
        hidden, p_logits = out.hidden[layer][0], out.logits[0].float().cpu()
        predicted = unroll(draft, hidden[None], depth)[0]  # [T, depth, H]
        anchors = torch.nonzero(valid_depths(mask, torch.arange(T), 1)[:, 0]).flatten()
        for chunk in anchors.split(ANCHOR_CHUNK):
            at = (chunk[:, None] + torch.arange(1, depth + 1)).clamp(max=T - 1)
            valid = valid_depths(mask, chunk, depth)
            q_logits = draft_logits(draft, predicted[chunk], ids[at].to(draft.device)).cpu()
            if draft.shared.hot is not None:  # columns are the draft's vocabulary: q = 0 outside it
                q_logits = draft.shared.hot.expand(q_logits)
            p = torch.softmax(p_logits[at], -1)
            greedy = p.argmax(-1)
            match = q_logits.argmax(-1) == greedy
            in_top = (q_logits.topk(min(width, q_logits.shape[-1]), -1).indices == greedy[..., None]).any(-1)
            terms = {"mse": (predicted[chunk].float() - hidden[at.to(hidden.device)].float()).pow(2).mean(-1).cpu(), "top1": match,
                     f"top{width}": in_top, "chain_top1": match.cummin(dim=1).values,
                     "expected_acceptance": torch.minimum(p, torch.softmax(q_logits, -1)).sum(-1)}
            for name, value in terms.items():
                sums[name] += (value.float() * valid).sum(0)
            count += valid.sum(0)
    draft.train(was_training)
    per = count.clamp(min=1)
    return {"depth": list(range(1, depth + 1)), **{name: (sums[name] / per).tolist() for name in names},
            "anchors": count.int().tolist(), "sequences": len(data)}


def format_hidden_table(result: dict) -> str:
    width = next(k for k in result if k.startswith("top") and k != "top1")
    lines = [format_depth_table(result), "", f"| depth | hidden MSE | target greedy in draft {width} |", "|---:|---:|---:|"]
    lines += [f"| {d} | {result['mse'][i]:.4f} | {result[width][i]:.3f} |" for i, d in enumerate(result["depth"])]
    return "\n".join(lines)


def drafted_tokens(data: TokenData) -> torch.Tensor:
    """The tokens a drafter has to propose: token t + 1 wherever the logits at t are trained (assistant text)."""
    return data.input_ids[:, 1:][data.loss_mask[:, :-1]]


def hot_vocab_coverage(train: TokenData, held_out: TokenData, sizes: tuple[int, ...], vocab_size: int) -> dict:
    """Hot vocabularies counted on the training data's drafted tokens; their coverage of the held-out ones."""
    counts = Counter(drafted_tokens(train).tolist())
    test = drafted_tokens(held_out).tolist()
    coverage = {str(size): round(hot_vocab_from_counts(counts, size, vocab_size).coverage(test), 4)
                for size in sorted({min(s, vocab_size) for s in sizes})}
    return {"counted_on": "training data, assistant tokens", "train_tokens": sum(counts.values()),
            "distinct_train_tokens": len(counts), "held_out_tokens": len(test), "vocab_size": vocab_size,
            "coverage": coverage}


def format_coverage(report: dict) -> str:
    lines = [f"Hot vocabulary coverage of {report['held_out_tokens']} held-out assistant tokens "
             f"(counted on {report['train_tokens']} training tokens):", "", "| hot tokens | coverage |", "|---:|---:|"]
    lines += [f"| {size} | {value:.4f} |" for size, value in report["coverage"].items()]
    return "\n".join(lines)
