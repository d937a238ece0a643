"""A drafter's own vocabulary (EAGLE-3's draft vocabulary; the parallel head's and hidden-state draft's
--draft-vocab): the tokens drafted most often in the training data, and the KL to the target restricted to them.

A drafter that scores only N of the target's tokens drafts q = 0 elsewhere, which stays lossless (verification
uses the target's full p); training it on KL(p' || q), p' the target's distribution restricted to those tokens,
teaches it the very distribution it drafts from, and its output layer costs N rows instead of the vocabulary.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F

from foretell.hot_vocab import hot_vocab_from_counts
from foretell.train.common.data import TokenData
from foretell.train.common.depths import valid_depths
from foretell.train.common.features import FeatureCache
from foretell.train.common.topk import coarsened_kl

MASKED = -1e4  # log q of dropped top-k slots: finite, so gradients stay finite, and exp() of it is 0


def draft_vocabulary(data: TokenData, size: int, vocab_size: int, special_ids=()) -> torch.Tensor:
    """The `size` target tokens drafted most often in the training data (the tokens after every trained
    position), special tokens first (end-of-turn must stay draftable); ascending ids."""
    drafted = data.input_ids[:, 1:][data.loss_mask[:, :-1]]
    counts = Counter(drafted.tolist())
    for special in special_ids:
        counts[special] += 10**9
    return hot_vocab_from_counts(counts, size, vocab_size).ids


def new_draft_vocabulary(tokenizer, data: TokenData, size: int, vocab_size: int) -> torch.Tensor | None:
    """A new drafter's own vocabulary of `size` tokens (draft_vocabulary, with the tokenizer's special tokens),
    or None for size 0: the drafter keeps the target's whole vocabulary."""
    if not size:
        return None
    return draft_vocabulary(data, size, vocab_size, getattr(tokenizer, "all_special_ids", []))


def columns_of(vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size] long: each target id's column in a draft vocabulary `vocab_ids`, -1 outside it."""
    columns = torch.full((vocab_size,), -1, dtype=torch.long)
    columns[vocab_ids.cpu()] = torch.arange(len(vocab_ids))
    return columns


def draft_vocab_kl(logits: torch.Tensor, logp: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Per-position KL(p' || q) [...]: q = softmax(logits [..., V_draft]); p' = the target's top-k (log-probs
    logp [..., k] at draft columns `columns` [..., k], -1 = outside the draft vocabulary) with the outside
    entries dropped and the rest, tail included, renormalised. As common/topk.py, the divergence between p'
    and q coarsened to the kept entries plus one tail bucket."""
    keep = columns >= 0
    p = logp.exp()
    z = (1.0 - (p * ~keep).sum(-1)).clamp(min=1e-12)  # p's mass left once the outside entries are dropped
    p_kept = torch.where(keep, p / z[..., None], torch.zeros_like(p))
    logp_kept = torch.where(keep, logp - z.log()[..., None], torch.zeros_like(logp))
    log_q = F.log_softmax(logits.float(), dim=-1)
    log_q_top = torch.where(keep, log_q.gather(-1, columns.clamp(min=0)), torch.full_like(logp, MASKED))
    return coarsened_kl(p_kept, logp_kept, log_q_top)


def trained_pairs(cache: FeatureCache, data: TokenData, sequence: int, anchors: torch.Tensor, columns_per_anchor: int,
                  vocab_columns: torch.Tensor | None) -> torch.Tensor:
    """[A, C] bool: the (anchor, column) pairs an anchor-trained head learns from, column j scoring token
    a + 2 + j: an assistant token, whose target top-1 the drafter's vocabulary holds when it has its own
    (`vocab_columns`, columns_of's map; None = the whole vocabulary), as SpecForge masks positions a draft
    vocabulary cannot express."""
    valid = valid_depths(data.loss_mask[sequence], anchors, columns_per_anchor)
    if vocab_columns is not None:
        top1 = torch.from_numpy(np.asarray(cache.ids[sequence][:, 0]).astype(np.int64))
        at = (anchors[:, None] + torch.arange(1, columns_per_anchor + 1)).clamp(max=len(top1) - 1)
        valid &= vocab_columns[top1[at]] >= 0
    return valid
