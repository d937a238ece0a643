"""The target's logits at every verified position, processed by penalties, logit bias and a grammar, each
position given its own prefix.

A verification pass scores several positions at once: row 0 the token after the committed ones, row i + 1
the token after draft node i. A penalty depends on the tokens before the position, so row i + 1 is
processed as if the committed tokens plus node i's path (a chain: the drafts before it; a tree: its
ancestors and itself) had been generated. Every row then equals what plain decoding, one token a pass, would
process at that position, and the verifier (any rule) chooses from those rows: speculation stays exact.

The transform is elementwise per row, so a row's result does not depend on the other rows in the pass.
"""

from __future__ import annotations

import torch

from foretell.errors import ForetellError
from foretell.tree import attention_mask, chain_parents
from foretell.types import Proposal, SamplingParams, TokenLogprob


class LogitsProcessor:
    """One request's logits processing: its prompt, the tokens generated so far, and its grammar (grammar.py)."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab_size: int, device, grammar=None):
        self.params, self.vocab_size, self.grammar = params, vocab_size, grammar
        for token, _ in params.logit_bias:
            if token >= vocab_size:
                raise ForetellError(f"logit_bias names token {token}, but the model's vocabulary has {vocab_size} "
                                    f"tokens (ids 0 to {vocab_size - 1})")
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # generated tokens
        self.in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if params.repetition_penalty != 1.0 and prompt_ids:
            self.in_prompt[torch.tensor(prompt_ids, device=device).clamp_max(vocab_size - 1)] = True
        self.bias = None
        if params.logit_bias:
            self.bias = torch.zeros(vocab_size, dtype=torch.float32, device=device)
            tokens, values = zip(*params.logit_bias)
            self.bias[torch.tensor(tokens, device=device)] = torch.tensor(values, device=device)

    def allowed_nodes(self, proposal: Proposal) -> list[int] | None:
        """The draft nodes the grammar allows (a node whose token or an ancestor's it forbids could never be
        accepted), or None when it allows them all."""
        return None if self.grammar is None else self.grammar.allowed_nodes(proposal)

    def rows(self, logits: torch.Tensor, proposal: Proposal) -> torch.Tensor:
        """[R, V] logits of a pass over [last, nodes...] -> float32 processed logits (R <= 1 + proposal.size rows;
        one for plain decoding)."""
        p = self.params
        logits = logits.float()
        vocab = logits.shape[-1]
        if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
            counts = self._counts(proposal, logits.shape[0])[:, :vocab]
            seen = counts > 0
            if p.repetition_penalty != 1.0:
                hit = seen | self.in_prompt[:vocab]
                penalised = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
                logits = torch.where(hit, penalised, logits)
            if p.frequency_penalty:
                logits = logits - p.frequency_penalty * counts
            if p.presence_penalty:
                logits = logits - p.presence_penalty * seen.float()
        if self.bias is not None:
            logits = logits + self.bias[:vocab]
        if self.grammar is not None:
            allowed = self.grammar.allowed_rows(proposal, logits.shape[0], vocab).to(logits.device)
            logits = logits.masked_fill(~allowed, float("-inf"))
        return logits

    def _counts(self, proposal: Proposal, rows: int) -> torch.Tensor:
        """[rows, V] generated-token counts each row's position has seen: the committed ones plus its path."""
        counts = self.counts.expand(rows, -1).clone()
        n = min(proposal.size, rows - 1)
        if n:
            parents = chain_parents(n) if proposal.is_chain else proposal.parents[:n]
            # Slot r sees node j iff j is r - 1 or one of its ancestors (the tree attention mask, root column off).
            slot, node = attention_mask(parents)[:rows, 1:].nonzero(as_tuple=True)
            tokens = proposal.tokens[:n].to(counts.device)
            counts.index_put_((slot.to(counts.device), tokens[node.to(counts.device)]),
                              torch.ones(len(slot), device=counts.device), accumulate=True)
        return counts

    def commit(self, tokens: list[int]) -> None:
        """Tokens generated (in order): they count from the next position on, and advance the grammar."""
        if tokens:
            ids = torch.tensor(tokens, device=self.counts.device).clamp_max(self.vocab_size - 1)
            self.counts.index_put_((ids,), torch.ones(len(tokens), device=self.counts.device), accumulate=True)
        if self.grammar is not None:
            self.grammar.commit(tokens)


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Row i's log-softmax at tokens[i], and its `top` most likely tokens (those the processing left possible)."""
    logp = torch.log_softmax(logits.float(), -1)
    chosen = logp[torch.arange(len(tokens), device=logp.device), torch.tensor(tokens, device=logp.device)].tolist()
    tops: list[tuple] = [()] * len(tokens)
    if top:
        values, ids = logp.topk(min(top, logp.shape[-1]), dim=-1)
        tops = [tuple((t, v) for t, v in zip(row_ids, row_values) if v != float("-inf"))
                for row_ids, row_values in zip(ids.tolist(), values.tolist())]
    return [TokenLogprob(t, lp, tp) for t, lp, tp in zip(tokens, chosen, tops)]


def keep_nodes(proposal: Proposal, kept: list[int]) -> Proposal:
    """The proposal of only the nodes `kept` (ascending, every kept node's parent kept too), renumbered."""
    index = torch.tensor(kept, dtype=torch.long)
    pick = lambda t: None if t is None else t[index.to(t.device)]  # noqa: E731
    if proposal.is_chain:  # a chain keeps a prefix
        return Proposal(proposal.tokens[:len(kept)], pick(proposal.q), None, pick(proposal.draft_prob))
    new = {old: i for i, old in enumerate(kept)}
    parents = torch.tensor([new.get(int(proposal.parents[i]), -1) for i in kept], dtype=torch.long)
    return Proposal(pick(proposal.tokens), pick(proposal.q), parents, pick(proposal.draft_prob))
