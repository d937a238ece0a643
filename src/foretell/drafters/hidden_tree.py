"""The hidden-state drafter (Make Every Draft Count): token-info tree sampling, resampling and fusion.

One chain of draft steps serves the whole tree. The draft (models/hidden_draft.py) sees the
target's final-normed hidden states of the committed tokens (engine hook), predicts the state
of the last committed token (the root), then keeps predicting from its own predictions:
`depth` steps give logits L_1..L_depth for depths 1..depth, independent of any token.
Tokens enter only here: the children of a node holding token t at depth d come from
softmax(L_{d+1} + E(t)) (the root is depth 0). The tree is grown best first: every node offers
its top-`width` children, and the `max_nodes` nodes of highest cumulative log-probability are
kept (that set is closed under ancestors, so the tree "follows the most probable path in depth").

Resampling: after the verification, the committed tokens tell which path was accepted (a
nodes) and which token b the target supplied at depth a + 1. The logits L_{a+2}.. of the last
chain are still valid predictions for the positions after b (they never depended on tokens),
so a subtree below b comes from them plus E(b) without any draft forward. It is built only
when triggered (`resample_when` / `resample_threshold`) and spans at most `resample_depth` levels.

Fusion: the resampled subtree hangs below the new root b, exactly where the next regular tree
hangs, so the next proposal merges both into one tree (a trie: shared prefixes once, siblings
distinct) and prunes it to `max_nodes` by score. The target verifies them in its one pass.
Without fusion the resampled subtree is proposed alone (a verification pass with no draft
forward) and the regular tree follows at the step after.

Hardware-aware budget: with an AdaptiveTreeScheduler (sizing/tree.py, the same one
the parallel head uses) the tree is grown to the scheduler's node cap and the scheduler keeps the
best-first prefix that maximises expected tokens per second on this machine now.

Children are chosen deterministically (top-k, pruning), so proposals carry no q rows: the tree
verifier treats them as point masses (the EAGLE rule), lossless for greedy and sampled decoding.
Under the coupled rule (coupled.py) children are ranked with the verifier's noise (draft_ranking).
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator

import torch

from foretell.config import HiddenStateOptions
from foretell.coupled import draft_ranking
from foretell.drafters.base import empty_proposal, run_alone
from foretell.drafters.hooked_tree import HookedTreeDrafter
from foretell.errors import ForetellError
from foretell.models.hidden_draft import HiddenDraft
from foretell.models.token_info import TokenInfoTable
from foretell.runtime.lean_drafters import LayersPass
from foretell.sampling import ranking_probs
from foretell.types import Proposal, SamplingParams

if TYPE_CHECKING:
    from foretell.sizing.tree import AdaptiveTreeScheduler

DEFAULT_HOT_VOCAB = 8192  # output tokens of the benchmarked configuration (the paper keeps a few thousand hot tokens)
INFO_MEMO_BYTES = 64 << 20  # E rows kept between proposals of one generation (tokens recur: digits, " the")


Tree = tuple[list[int], list[int], list[float]]  # tokens, parents, cumulative log-probabilities


def grow_info_tree(
    child_probs: Callable[[int, int], torch.Tensor], num_levels: int, root_token: int, max_nodes: int, width: int,
    out_ids: list[int] | None = None,
) -> Tree:
    """The best-first tree below `root_token`.

    child_probs(level, token) -> [V_out] probabilities of the children (at depth level + 1) of a
    node holding `token` at depth `level`; out_ids maps output columns to token ids (hot vocab).
    Nodes come out in non-increasing score order, parents first, so the first max_nodes are the
    best nodes of the full width-ary tree. A node's children are computed only when its own
    score comes up in the queue (an upper bound on theirs), so nodes past the budget cost nothing.
    Zero-probability children (cut by top-k / top-p) are never proposed.
    """
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    if num_levels < 1:
        return tokens, parents, scores
    EXPAND, ADD = 0, 1
    heap: list[tuple] = [(0.0, 0, EXPAND, (-1, root_token, 0))]  # (-score, order, kind, payload)
    order = 1  # unique: ties pop first-pushed first, and payloads are never compared
    while heap and len(tokens) < max_nodes:
        neg, _, kind, payload = heapq.heappop(heap)
        if kind == ADD:
            token, parent, level = payload
            tokens.append(token)
            parents.append(parent)
            scores.append(-neg)
            if level < num_levels:  # expand later, when its score (>= its children's) comes up
                heapq.heappush(heap, (neg, order, EXPAND, (len(tokens) - 1, token, level)))
                order += 1
            continue
        node, token, level = payload
        q = child_probs(level, token)
        top = torch.topk(q.float(), min(width, q.shape[-1]))
        for value, column in zip(top.values.tolist(), top.indices.tolist()):
            if value <= 0.0:
                break
            child = out_ids[column] if out_ids is not None else column
            heapq.heappush(heap, (neg - math.log(value), order, ADD, (child, node, level + 1)))
            order += 1
    return tokens, parents, scores


def merge_trees(trees: list[Tree], max_nodes: int) -> tuple[list[int], list[int], list[float], list[int]]:
    """Union of trees under one root as a trie, pruned to the max_nodes best nodes.

    A node on several trees keeps its best score. Returns tokens, parents, scores and, per
    node, a bit mask of the trees that held it. Every tree's child scores <= its parent's, so
    ranking by (score desc, depth) keeps the selection closed under ancestors.
    """
    index: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    sources: list[int] = []
    level: list[int] = []
    for s, (tree_tokens, tree_parents, tree_scores) in enumerate(trees):
        local: list[int] = []
        for token, parent, score in zip(tree_tokens, tree_parents, tree_scores):
            key = (local[parent] if parent >= 0 else -1, token)
            i = index.get(key)
            if i is None:
                i = index[key] = len(tokens)
                tokens.append(token)
                parents.append(key[0])
                scores.append(score)
                sources.append(0)
                level.append(1 if key[0] < 0 else level[key[0]] + 1)
            scores[i] = max(scores[i], score)
            sources[i] |= 1 << s
            local.append(i)
    keep = sorted(range(len(tokens)), key=lambda i: (-scores[i], level[i], i))[:max_nodes]
    new = {old: n for n, old in enumerate(keep)}
    return (
        [tokens[i] for i in keep],
        [new[parents[i]] if parents[i] >= 0 else -1 for i in keep],
        [scores[i] for i in keep],
        [sources[i] for i in keep],
    )


def follow(tokens: list[int], parents: list[int], path_tokens: list[int]) -> list[int]:
    """Nodes of the tree matching a prefix of path_tokens from the root (siblings are distinct)."""
    child = {(p, t): i for i, (t, p) in enumerate(zip(tokens, parents))}
    path: list[int] = []
    node = -1
    for token in path_tokens:
        node = child.get((node, token), -2)
        if node == -2:
            break
        path.append(node)
    return path


@dataclass
class _Chain:
    """The last regular proposal: its chain's logits and the tree it proposed, kept for resampling."""

    root_len: int  # len(tokens) when proposed: the root was tokens[root_len - 1]
    root_token: int
    logits: torch.Tensor  # [depth, V_out]: row d - 1 = depth-d logits
    tokens: list[int]
    parents: list[int]


@dataclass
class HiddenStateStats:
    """Counters for reports and ablations (reset by start)."""

    chains: int = 0  # regular proposals (each `depth` draft steps)
    resampled_subtrees: int = 0
    resampled_nodes: int = 0  # nodes of resampled subtrees that made it into a proposal
    accepted_resampled_only: int = 0  # accepted nodes that only a resampled subtree had proposed
    resample_seconds: float = 0.0


class HiddenStateDrafter(HookedTreeDrafter):
    name = "hidden-state"
    what = "hidden-state draft"

    def __init__(self, draft: HiddenDraft, options: HiddenStateOptions = HiddenStateOptions(),
                 scheduler: AdaptiveTreeScheduler | None = None):
        """With a scheduler, its node cap replaces options.max_nodes and it picks each step's budget."""
        super().__init__(draft, scheduler, options.max_nodes, (draft.target_layer,))
        self.draft, self.options = draft, options
        self.stats = HiddenStateStats()
        ids = draft.output_ids
        self._ids = ids  # column -> target id (None: columns are ids)
        self._out_ids = ids.tolist() if ids is not None else None
        self._chain: _Chain | None = None  # the last regular proposal, for resampling
        self._last: tuple[int, list[int], list[int], list[bool]] | None = None  # root_len, tokens, parents, resampled-only
        self._info_memo: dict[int, torch.Tensor] = {}  # token -> E row, for the current generation
        out_size = len(self._out_ids) if self._out_ids is not None else draft.config.vocab_size
        self._info_memo_rows = max(64, INFO_MEMO_BYTES // (4 * out_size))
        self.info_table: TokenInfoTable | None = None
        if options.token_info and options.token_info_cache and draft.token_info is not None:
            columns = self._out_ids if self._out_ids is not None else range(draft.config.vocab_size)
            chosen = list(columns)[: options.token_info_cache]
            with torch.no_grad():  # not inference_mode: the rows may meet autograd tensors later
                self.info_table = TokenInfoTable.build(chosen, lambda t: draft.info(torch.tensor(t, dtype=torch.long)))

    def start(self, prompt_ids, capacity: int, params: SamplingParams, generator) -> None:
        self._new_generation(capacity + self.options.depth, params)  # room for the chain's own predictions
        self.stats = HiddenStateStats()
        self._chain = self._last = None
        self._info_memo = {}

    def _rows(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        layer = self.draft.target_layer
        if layer not in hidden:
            raise ForetellError(f"the hidden-state draft needs target hidden layer {layer}, which was not provided")
        return hidden[layer]

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        """max_tokens caps the tree's depth (tokens left to generate)."""
        return run_alone(self.propose_steps(tokens, max_tokens))

    def propose_steps(self, tokens: list[int], max_tokens: int) -> Generator[LayersPass, Any, Proposal]:
        """propose(), yielding the draft's steps where they run in the lean step (a batch packs the requests'
        steps: run_together)."""
        self._check_observed(tokens)
        t0 = time.perf_counter()
        self._sent = ([], [])
        self._account(tokens)
        depth = min(self.options.depth, max_tokens)
        if depth <= 0:
            return empty_proposal()
        grow = self.max_nodes
        if self.schedule is not None:  # draft only what the scheduler may keep
            grow, depth_cap = self.schedule.growth_limits()
            depth = min(depth, max(depth_cap, 2))  # >= 2: resampling reuses the levels past the first
        resampled = self._resample(tokens, depth) if self.options.resample else None
        self._chain = None
        if resampled is not None and (not self.options.fuse or not self._pending):
            return self._proposal(len(tokens), [resampled], t0, only_resampled=True)
        if not self._pending:  # a one-token prompt: no target rows yet
            return empty_proposal()
        logits = yield from self._run_chain(depth)
        root = tokens[-1]
        regular = grow_info_tree(
            lambda level, token: self._child_probs(logits[level], token, len(tokens) + level), depth, root,
            grow, self.options.width, self._out_ids,
        )
        self.stats.chains += 1
        trees = [regular] if resampled is None else [regular, resampled]
        proposal = self._proposal(len(tokens), trees, t0)
        self._chain = _Chain(len(tokens), root, logits, self._last[1], self._last[2])
        return proposal

    # --- pieces --------------------------------------------------------------------------

    def _run_chain(self, depth: int) -> Generator[LayersPass, Any, torch.Tensor]:
        """Feed the pending target rows, then `depth - 1` own predictions: [depth, V_out] logits."""
        rows = self._take_pending()
        context = self.cache.length + rows.shape[0]
        predicted = [(yield from self._step(rows))[-1:]]  # the root's state, from the context
        self.cache.commit_prefix(rows.shape[0])
        for _ in range(depth - 1):
            predicted.append((yield from self._step(predicted[-1])))
            self.cache.commit_prefix(1)
        self.cache.truncate(context)  # keep target rows only; predictions are overwritten next time
        return self.draft.logits(torch.cat(predicted))

    def _step(self, rows: torch.Tensor) -> Generator[LayersPass, Any, torch.Tensor]:
        """The draft's step over `rows` (HiddenDraft.step), yielded where it runs in the lean step."""
        native = self.draft.native_step(rows, self.cache)
        return (yield native) if native is not None else self.draft.step(rows, self.cache)

    def _info(self, token: int) -> torch.Tensor | None:
        if not self.options.token_info or self.draft.token_info is None:
            return None
        row = self._info_memo.get(token)
        if row is None and len(self._info_memo) >= self._info_memo_rows:
            self._info_memo.clear()  # bounded memory; refilled by the tokens in use
        if row is None:
            row = self.info_table.get(token) if self.info_table is not None else None
            if row is None:
                row = self.draft.info(torch.tensor([token], dtype=torch.long))[0]
            self._info_memo[token] = row
        return row

    def _child_probs(self, level_logits: torch.Tensor, token: int, index: int | None = None) -> torch.Tensor:
        """The children's ranking (coupled.draft_ranking at their sequence index `index`; None: the draft's own
        distribution, ranking_probs)."""
        info = self._info(token)
        logits = level_logits if info is None else level_logits + info
        if index is None:
            return ranking_probs(logits, self.params)
        return draft_ranking(logits, self.params, self.noise, index, self._ids)

    def _resample(self, tokens: list[int], depth: int) -> tuple[list[int], list[int], list[float]] | None:
        """A subtree below the new root from the last chain's cached logits (no draft forward), or None."""
        chain = self._chain
        if chain is None:
            return None
        t0 = time.perf_counter()
        new = tokens[chain.root_len :]  # the accepted path, then the target's token b
        path = follow(chain.tokens, chain.parents, new)
        a = len(path)
        levels = min(self.options.resample_depth, chain.logits.shape[0] - (a + 1), depth)
        if a != len(new) - 1 or levels < 1:
            return None
        b = new[-1]
        parent_token = chain.root_token if a == 0 else new[a - 1]
        if not self._triggered(self._child_probs(chain.logits[a], parent_token), b):
            return None
        cached = chain.logits[a + 1 :]
        tree = grow_info_tree(
            lambda level, token: self._child_probs(cached[level], token, len(tokens) + level), levels, b,
            self.max_nodes, self.options.width, self._out_ids,
        )
        self.stats.resampled_subtrees += 1
        self.stats.resample_seconds += time.perf_counter() - t0
        return tree if tree[0] else None

    def _triggered(self, q: torch.Tensor, bonus: int) -> bool:
        """q: the draft's distribution at the rejected position (over output columns)."""
        when, threshold = self.options.resample_when, self.options.resample_threshold
        if when == "always":
            return True
        if when == "unsure":
            return float(q.max()) < threshold
        column = bonus if self._out_ids is None else self._column(bonus)
        return column is not None and float(q[column]) >= threshold

    def _column(self, token: int) -> int | None:
        i = bisect.bisect_left(self._out_ids, token)  # hot ids are sorted
        return i if i < len(self._out_ids) and self._out_ids[i] == token else None

    def _proposal(self, root_len: int, trees: list, t0: float, only_resampled: bool = False) -> Proposal:
        tokens, parents, scores, sources = merge_trees(trees, self.max_nodes)
        if self.schedule is not None and tokens:  # best-first order: any prefix is closed under ancestors
            n = self._schedule(scores, parents, t0)
            tokens, parents, scores, sources = tokens[:n], parents[:n], scores[:n], sources[:n]
        resampled_only = [only_resampled or s == 0b10 for s in sources]
        self.stats.resampled_nodes += sum(s & 0b10 > 0 or only_resampled for s in sources)
        self._last = (root_len, tokens, parents, resampled_only)
        if not tokens:
            return empty_proposal()
        # Each node's draft probability: its score less its parent's (capped: merged trees keep each node's best score).
        draft_prob = torch.tensor([min(1.0, math.exp(s - (scores[p] if p >= 0 else 0.0))) for s, p in zip(scores, parents)])
        return Proposal(
            tokens=torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long), draft_prob=draft_prob
        )

    def _account(self, tokens: list[int]) -> None:
        """Count accepted nodes of the last proposal that only a resampled subtree had proposed."""
        if self._last is None:
            return
        root_len, last_tokens, last_parents, resampled_only = self._last
        path = follow(last_tokens, last_parents, tokens[root_len:])
        self.stats.accepted_resampled_only += sum(resampled_only[i] for i in path)
        self._last = None
