"""An independent, smaller draft model sharing the target's tokenizer.

Its KV cache follows the committed sequence: before drafting it keeps the longest prefix it
already holds and feeds only the new tail in one forward, so no explicit commit call exists.
"""

from __future__ import annotations

import torch

from foretell.coupled import draft_ranking
from foretell.drafters.base import DraftPass, DrafterBase, empty_proposal, run_alone
from foretell.hot_vocab import HotVocab
from foretell.models.transformer import Transformer, warm_up
from foretell.runtime.packed import lean_takes
from foretell.sampling import processed_probs, sample
from foretell.types import Proposal, SamplingParams


class DraftModelDrafter(DrafterBase):
    name = "draft-model"

    def __init__(self, model: Transformer, target_vocab_size: int, hot: HotVocab | None = None):
        self.model = model
        self.target_vocab_size = target_vocab_size
        self.hot = hot
        self._hot_head = hot.head(model.lm_head) if hot is not None else None
        # a draft model in the lean step (its GGUF blocks): the hot rows there too, packed as its output layer
        lean = getattr(model, "lean", None)
        self._hot_lean = lean.with_head(self._hot_head) if hot is not None and lean is not None else None
        self.cache = None
        self.cached_tokens: list[int] = []  # tokens whose k/v sit in self.cache
        self.params = SamplingParams()
        self.generator = None

    def start(self, prompt_ids, capacity: int, params: SamplingParams, generator) -> None:
        if self.cache is None or self.cache.capacity < capacity:
            self.cache = self.model.new_cache(capacity)
        self.cache.truncate(0)
        self.cached_tokens = []
        self.params = params
        self.generator = generator
        # Prefill the prompt now (all but its last token, as the target does), so the time
        # lands in prefill and the first proposal feeds one token.
        prefix = list(prompt_ids[:-1])
        if prefix:
            device = self.model.device
            ids = torch.tensor(prefix, dtype=torch.long, device=device)
            self.model(ids, torch.arange(len(prefix), device=device), self.cache, logits_rows=slice(0, 0))
            self.cache.commit_prefix(len(prefix))
            self.cached_tokens = prefix

    def warm_up(self) -> None:
        with torch.inference_mode():
            warm_up(self.model, [1, 2, 3])

    def cache_bytes(self) -> int:
        return self.cache.nbytes() if self.cache is not None else 0

    def modules(self) -> tuple[torch.nn.Module, ...]:
        return (self.model,)

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Pad (or cut) the draft's vocabulary to the target's so q and p index the same tokens."""
        extra = self.target_vocab_size - logits.shape[-1]
        if extra > 0:
            return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
        return logits[..., : self.target_vocab_size]

    def _sync(self, tokens: list[int]) -> list[int]:
        """Roll the cache back to the common prefix with `tokens`; return the tokens to feed."""
        common = 0
        limit = min(len(self.cached_tokens), len(tokens) - 1)  # always feed >= 1 token for logits
        while common < limit and self.cached_tokens[common] == tokens[common]:
            common += 1
        self.cache.truncate(common)
        self.cached_tokens = self.cached_tokens[:common]
        return tokens[common:]

    def _logits_steps(self, ids, positions, rows: slice | None = None, tree_mask=None):
        """One draft forward, yielded as a DraftPass (run alone or packed with other requests'); returns the
        logits of the chosen rows over the target's vocabulary."""
        if self._hot_head is None:
            out = yield DraftPass(self.model, ids, positions, self.cache, tree_mask, (), rows)
            return self._to_target_vocab(out.logits)
        # Hot vocabulary: project the final hidden states onto the hot rows only.
        if self._hot_lean is not None:  # the lean step with the hot rows as its output layer, where it takes the pass
            hot = DraftPass(self.model, ids, positions, self.cache, tree_mask, (), rows, step=self._hot_lean)
            if lean_takes(self._hot_lean, hot):
                out = yield hot
                return self.hot.expand(out.logits.float())
        top = self.model.config.num_hidden_layers
        out = yield DraftPass(self.model, ids, positions, self.cache, tree_mask, (top,), slice(0, 0))
        hidden = out.hidden[top] if rows is None else out.hidden[top][rows]
        return self.hot.expand(self._hot_head(hidden).float())

    def _draft_logits(self, ids, positions, rows: slice | None = None, tree_mask=None) -> torch.Tensor:
        """One draft forward alone; logits of the chosen rows over the target's vocabulary."""
        return run_alone(self._logits_steps(ids, positions, rows, tree_mask))

    def _step_steps(self, feed: list[int]):
        start = self.cache.length
        ids = torch.tensor(feed, dtype=torch.long, device=self.model.device)
        positions = torch.arange(start, start + len(feed), device=self.model.device)
        logits = yield from self._logits_steps(ids, positions, rows=slice(-1, None))
        self.cache.commit_prefix(len(feed))
        self.cached_tokens.extend(feed)
        return logits[-1]

    def _step(self, feed: list[int]) -> torch.Tensor:
        return run_alone(self._step_steps(feed))

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        return run_alone(self.propose_steps(tokens, max_tokens))

    def propose_steps(self, tokens: list[int], max_tokens: int):
        """The chain, one draft forward a token, each yielded (a batch packs the requests' forwards)."""
        if max_tokens <= 0:
            return empty_proposal()
        feed = self._sync(tokens)
        drafted: list[int] = []
        q_rows: list[torch.Tensor] = []
        probs: list[float] = []  # the draft's probability of each token (read by lossy verification only)
        for i in range(max_tokens):
            logits = yield from self._step_steps(feed)
            if self.params.greedy:
                token = int(logits.argmax())
                probs.append(float(torch.softmax(logits.float(), -1)[token]))
            elif self.noise is not None:  # the coupled rule: the verifier's noise, so q close to p drafts its token
                ranked = draft_ranking(logits, self.params, self.noise, len(tokens) + i)
                token = int(ranked.argmax())
                probs.append(float(ranked[token]))
            else:
                q = processed_probs(logits, self.params)
                token = sample(q, self.generator)
                q_rows.append(q)
                probs.append(float(q[token]))
            drafted.append(token)
            feed = [token]
        q = torch.stack(q_rows) if q_rows else None  # None for greedy and coupled drafts: their verifiers read no q
        return Proposal(tokens=torch.tensor(drafted, dtype=torch.long), q=q, draft_prob=torch.tensor(probs))
