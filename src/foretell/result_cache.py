"""The result cache: continuations the target already accepted, offered again as an extra tree branch.

Every token the engine commits has passed the target's verification (or is the target's
own token), so the committed outputs of this request and of earlier requests of the same
engine are verified work. The cache indexes them by n-gram; when the current context ends in
an indexed n-gram, what followed it last time becomes one branch merged into the drafter's
tree (shared prefixes once, within the drafter's node budget), and the target checks it in
the same pass.

Lossless at any temperature: the branch depends only on committed tokens, so each of its
nodes is a deterministic candidate (a point mass, q = one-hot). Its nodes are appended after
the drafter's nodes, so at each parent they are tried after the drafter's own children:
SpecInfer's rule there accepts a point-mass candidate x with the residual's probability of x
and otherwise zeroes x in the residual, which is exact whatever rule the earlier siblings used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from foretell.corpus import Corpus
from foretell.errors import ForetellError
from foretell.sizing.branch import BranchSizer
from foretell.tree import chain_parents, children_lists
from foretell.types import Proposal


@dataclass
class ResultCache:
    max_ngram: int = 4
    min_ngram: int = 2  # a single token is too weak a key: hits would mostly be rejected
    max_branch: int = 8  # tokens one branch may propose
    max_tokens: int = 1_000_000  # stored tokens over all requests; the oldest requests go first
    # Also index the request's prompt: prompt lookup's n-gram match then arrives as a branch of the
    # drafter's tree (one target pass checks both), e.g. the numbers a GSM8K answer copies from its question.
    include_prompt: bool = False
    # A corpus of the target's own answers (corpus.py): its continuation is the branch when nothing stored matches.
    corpus: Corpus | None = None
    _sequences: list[list[int]] = field(default_factory=list)  # committed sequences, the newest last
    _indexed: list[int] = field(default_factory=list)  # per sequence: continuation starts indexed so far
    _index: dict[tuple[int, ...], tuple[int, int]] = field(default_factory=dict)  # n-gram -> (seq no, start)
    _first: int = 0  # sequence number of _sequences[0] (numbers stay valid as old ones are dropped)
    sizer: BranchSizer = field(default_factory=BranchSizer)  # trims the branch where the scheduler sizes passes

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram or self.max_branch < 1:
            raise ForetellError(
                f"result cache needs 1 <= min_ngram <= max_ngram and max_branch >= 1, "
                f"got {self.min_ngram}, {self.max_ngram}, {self.max_branch}"
            )

    def clear(self) -> None:
        """Forget every stored request (the settings stay)."""
        self._first += len(self._sequences)  # numbers keep growing, so no stale index entry can match
        self._sequences, self._indexed, self._index = [], [], {}

    def begin(self, prompt_ids: list[int]) -> int:
        """A new request: its committed output will be indexed as it grows (keys may reach into the prompt).
        Returns the request's sequence number, which its extend calls pass: requests decoded together (the
        batching server) each write into their own sequence, never into the newest one."""
        self._sequences.append([])
        # Continuations start in the output only unless include_prompt: then the prompt is indexed too.
        self._indexed.append(0 if self.include_prompt else len(prompt_ids))
        number = self._first + len(self._sequences) - 1
        self.extend(number, list(prompt_ids))
        self._evict()
        return number

    def extend(self, number: int, committed: list[int]) -> None:
        """Request `number`'s (begin's result) committed tokens so far, prompt included. A request whose sequence
        was dropped meanwhile (token limit, clear) is no longer stored: its tokens are ignored."""
        at = number - self._first
        if at < 0:
            return
        if at >= len(self._sequences):
            raise ForetellError(f"result cache: no request {number} was begun (the newest is "
                                f"{self._first + len(self._sequences) - 1})")
        seq = self._sequences[at]
        seq[len(seq):] = committed[len(seq):]
        # Index start j (the continuation begins at seq[j]) once seq[j] exists.
        for j in range(self._indexed[at], len(seq)):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if j >= n:
                    self._index[tuple(seq[j - n : j])] = (number, j)  # the newest occurrence wins
        self._indexed[at] = max(self._indexed[at], len(seq))

    def sequences(self) -> list[list[int]]:
        """Copies of the stored sequences (prompt and committed output per request), the oldest first."""
        return [list(seq) for seq in self._sequences]

    def lookup(self, context: list[int], max_tokens: int) -> list[int]:
        """What followed the longest indexed suffix n-gram of `context` last time ([] when none)."""
        return self.match(context, max_tokens)[0]

    def match(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        """lookup's branch and the length n of the n-gram it matched (0 when none): longer keys predict better.
        Without a stored match, the corpus's continuation (if there is a corpus)."""
        limit = min(max_tokens, self.max_branch)
        if limit <= 0:
            return [], 0
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            hit = self._index.get(tuple(context[len(context) - n :]))
            if hit is None or hit[0] < self._first:
                continue
            seq = self._sequences[hit[0] - self._first]
            return seq[hit[1] : hit[1] + limit], n
        if self.corpus is not None:
            return self.corpus.match(context, limit)
        return [], 0

    def _evict(self) -> None:
        while len(self._sequences) > 1 and sum(map(len, self._sequences)) > self.max_tokens:
            self._sequences.pop(0)
            self._indexed.pop(0)
            self._first += 1
        # Stale entries point below _first and are skipped by lookup; drop them now and then.
        if len(self._index) > 4 * self.max_tokens:
            self._index = {k: v for k, v in self._index.items() if v[0] >= self._first}


def make_result_cache(mode: bool | str | None, corpus: Corpus | None = None) -> ResultCache | None:
    """The cache for a mode: None / False = off; True / "outputs" = earlier outputs; "prompt" = the prompt too.
    A corpus turns it on (outputs mode unless `mode` says prompt) with the corpus behind the stored outputs."""
    if mode in (None, False):
        return None if corpus is None else ResultCache(corpus=corpus)
    if mode not in (True, "outputs", "prompt"):
        raise ForetellError(f"result_cache is True / 'outputs' (earlier output) or 'prompt' (the prompt too), not {mode!r}")
    return ResultCache(include_prompt=mode == "prompt", corpus=corpus)


@dataclass
class Merged:
    proposal: Proposal
    added: list[int]  # nodes of the merged tree that only the cache proposed


def merge_branch(proposal: Proposal, branch: list[int], max_nodes: int) -> Merged:
    """The proposal as a tree with `branch` (tokens below the root) merged in, at most max_nodes nodes.

    A branch token already present as a child of its parent is shared. New nodes go after the
    drafter's nodes. When the budget is full, the branch may take up to a quarter of it (at
    least one node) from the drafter's least valuable leaves: lowest path probability under
    draft_prob, or, without it, the latest nodes (best-first drafters emit their best first).
    """
    n = proposal.size
    parents = proposal.parents.tolist() if not proposal.is_chain else chain_parents(n).tolist()
    tokens = proposal.tokens.tolist()
    child = {(p, t): i for i, (t, p) in enumerate(zip(tokens, parents))}
    node, shared = -1, []
    for token in branch:
        nxt = child.get((node, token))
        if nxt is None:
            break
        shared.append(nxt)
        node = nxt
    new = branch[len(shared):]
    room = max_nodes - n
    take = min(len(new), max(room, max(1, max_nodes // 4)))
    new = new[:take]
    keep = _evict_leaves(parents, proposal.draft_prob, n + len(new) - max_nodes, protected=set(shared))
    new = new[: max_nodes - len(keep)]  # when too few leaves could go
    if not new:
        return Merged(proposal, [])
    index = {old: i for i, old in enumerate(keep)}
    kept_parents = [index[parents[i]] if parents[i] >= 0 else -1 for i in keep]
    attach = index[node] if node >= 0 else -1
    added = []
    for token in new:
        added.append(len(keep) + len(added))
        kept_parents.append(attach)
        attach = added[-1]
    sel = torch.tensor(keep, dtype=torch.long)
    extra = torch.tensor(new, dtype=torch.long)
    q = None
    if proposal.q is not None:  # the branch's rows are point masses on its tokens
        one_hot = torch.nn.functional.one_hot(extra, proposal.q.shape[-1]).to(proposal.q.dtype).to(proposal.q.device)
        q = torch.cat([proposal.q[sel.to(proposal.q.device)], one_hot])
    draft_prob = None
    if proposal.draft_prob is not None:  # the drafter never vouched for the branch: never waived by lossy mode
        draft_prob = torch.cat([proposal.draft_prob[sel], torch.zeros(len(new), dtype=proposal.draft_prob.dtype)])
    elif n == 0:  # no drafter this pass (the draft gate): the branch alone, vouched for by nobody
        draft_prob = torch.zeros(len(new))
    merged = Proposal(
        tokens=torch.cat([proposal.tokens[sel], extra]), q=q,
        parents=torch.tensor(kept_parents, dtype=torch.long), draft_prob=draft_prob,
    )
    return Merged(merged, added)


def _evict_leaves(parents: list[int], draft_prob, count: int, protected: set[int]) -> list[int]:
    """Indices kept after removing `count` leaves, lowest value first (re-checking leaves as they go)."""
    alive = list(range(len(parents)))
    if count <= 0:
        return alive
    if draft_prob is not None:
        probs, value = draft_prob.tolist(), []
        for i, p in enumerate(parents):
            value.append(probs[i] * (value[p] if p >= 0 else 1.0))
    else:
        value = [-float(i) for i in range(len(parents))]
    removed: set[int] = set()
    kids = [len(c) for c in children_lists(torch.tensor(parents, dtype=torch.long))[1:]]
    for _ in range(count):
        leaves = [i for i in alive if kids[i] == 0 and i not in protected and i not in removed]
        if not leaves:
            break
        worst = min(leaves, key=lambda i: (value[i], -i))
        removed.add(worst)
        if parents[worst] >= 0:
            kids[parents[worst]] -= 1
    return [i for i in alive if i not in removed]

