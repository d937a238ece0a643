"""Prompt lookup (n-gram) drafting: no model, copy what followed the last n-gram before.

Effective when the output repeats its context (summaries, code edits, RAG answers). With a corpus of the target's
own answers (corpus.py), a context without a match of two tokens or more drafts the corpus's most frequent
continuation instead, and a one-token match of the context comes last.
"""

from __future__ import annotations

import torch

from foretell.corpus import Corpus
from foretell.drafters.base import DrafterBase, empty_proposal
from foretell.types import Proposal, SamplingParams


class PromptLookupDrafter(DrafterBase):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, corpus: Corpus | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.corpus = corpus

    def start(self, prompt_ids, capacity, params: SamplingParams, generator) -> None:
        pass  # stateless: everything it needs is in the committed tokens

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        if max_tokens <= 0:
            return empty_proposal()
        if self.corpus is None:
            continuation = find_continuation(tokens, max_tokens, self.max_ngram, self.min_ngram)
        else:  # the context's longer matches, then the corpus, then the context's one-token matches
            continuation = (find_continuation(tokens, max_tokens, self.max_ngram, max(2, self.min_ngram))
                            or self.corpus.match(tokens, max_tokens)[0]
                            or (find_continuation(tokens, max_tokens, 1, 1) if self.min_ngram == 1 else []))
        return Proposal(tokens=torch.tensor(continuation, dtype=torch.long))  # q = one-hot


def find_continuation(tokens: list[int], max_tokens: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Tokens that followed the most recent earlier occurrence of the longest matching suffix n-gram."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - n :]
        # Search backwards so the most recent occurrence wins; start must leave a following token.
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + max_tokens]
                if follow:
                    return follow
    return []
