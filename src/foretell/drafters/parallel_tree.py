"""The parallel-head drafter: one head forward per step gives D distributions, grown into a tree.

It reads the target's hidden states through the engine's hook (`target_layers` / `observe`):
the rows of newly committed tokens wait in `_pending` until the next proposal feeds them to
the head, together with the D - 1 placeholders, in a single forward.

The per-depth distributions q_1..q_D do not depend on the tree parent, so every node at depth
d gets the same candidate children: the top-`width` tokens of q_{d+1}. The tree keeps the
`max_nodes` nodes of highest cumulative log-probability (best first, which keeps it closed under
ancestors). Children are chosen deterministically, so the proposal carries no q rows and the
tree verifier treats them as point masses (the EAGLE rule): lossless greedy and sampled.
Under the coupled rule (coupled.py) q_d is replaced by a ranking with the verifier's noise (draft_ranking).
"""

from __future__ import annotations

import heapq
import math
import time
from typing import TYPE_CHECKING, Any, Generator

import torch

from foretell.config import HeadTreeShape
from foretell.coupled import draft_ranking
from foretell.drafters.base import empty_proposal, run_alone
from foretell.drafters.hooked_tree import HookedTreeDrafter
from foretell.errors import ForetellError
from foretell.models.parallel_head import ParallelHead
from foretell.runtime.lean_drafters import LayersPass
from foretell.types import Proposal, SamplingParams

if TYPE_CHECKING:
    from foretell.sizing.tree import AdaptiveTreeScheduler


def grow_tree(q: torch.Tensor, max_nodes: int, width: int) -> tuple[list[int], list[int], list[float]]:
    """Tokens, parents and scores of the best-first tree over per-depth distributions q [depth, V].

    A candidate's score is its parent's plus log q_d(token). Candidates are enumerated lazily
    (a node's best child, a node's next sibling), so the nodes come out in non-increasing score
    order: the first max_nodes are the best ones, and a parent always precedes its children.
    Zero-probability tokens (cut by top-k / top-p) are never proposed.
    """
    depth = q.shape[0]
    k = min(width, q.shape[-1])
    top = torch.topk(q.float(), k, dim=-1)
    logq = top.values.clamp_min(0.0).log().tolist()  # [depth][k], descending per row
    best = top.indices.tolist()
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    order = 0  # tie-break: first pushed, first popped (deterministic)
    heap = [(-logq[0][0], order, -1, 0, 0)]  # (-score, order, parent, depth index, rank)
    while heap and len(tokens) < max_nodes:
        neg, _, parent, d, r = heapq.heappop(heap)
        if neg == math.inf:  # zero probability: so are the siblings ranked below
            continue
        node = len(tokens)
        tokens.append(best[d][r])
        parents.append(parent)
        scores.append(-neg)
        base = scores[parent] if parent >= 0 else 0.0
        if r + 1 < k:
            order += 1
            heapq.heappush(heap, (-(base + logq[d][r + 1]), order, parent, d, r + 1))
        if d + 1 < depth:
            order += 1
            heapq.heappush(heap, (-(scores[node] + logq[d + 1][0]), order, node, d + 1, 0))
    return tokens, parents, scores


def node_probs(q: torch.Tensor, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """[N] each node's probability q_d(token) at its depth d (the draft_prob read by lossy verification)."""
    depth: list[int] = []
    for p in parents:
        depth.append(depth[p] + 1 if p >= 0 else 0)
    if not tokens:
        return torch.empty(0)
    return q[torch.tensor(depth), torch.tensor(tokens)].float().cpu()


class ParallelHeadDrafter(HookedTreeDrafter):
    name = "parallel-head"
    what = "parallel head"

    def __init__(
        self, head: ParallelHead, shape: HeadTreeShape = HeadTreeShape(), scheduler: AdaptiveTreeScheduler | None = None
    ):
        """With a scheduler, its limits replace the fixed shape's and it picks each step's tree."""
        if scheduler is None and shape.depth > head.config.depth:
            raise ForetellError(f"tree depth {shape.depth} exceeds the parallel head's depth {head.config.depth}")
        super().__init__(head, scheduler, shape.max_nodes, head.config.fuse_layers)
        self.head = head
        if scheduler is not None:
            limits = scheduler.limits
            shape = HeadTreeShape(limits.max_nodes, min(limits.max_depth, head.config.depth), limits.max_width)
        self.shape = shape

    def start(self, prompt_ids, capacity: int, params: SamplingParams, generator) -> None:
        self._new_generation(capacity + self.head.config.depth, params)  # room for the placeholders

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        """max_tokens caps the tree's depth (tokens left to generate)."""
        return run_alone(self.propose_steps(tokens, max_tokens))

    def propose_steps(self, tokens: list[int], max_tokens: int) -> Generator[LayersPass, Any, Proposal]:
        """propose(), yielding the head's pass where it runs in the lean step (a batch packs the requests' passes:
        run_together)."""
        self._check_observed(tokens)
        depth, grow = min(self.shape.depth, max_tokens), self.shape.max_nodes
        if self.schedule is not None:  # draft only what the scheduler may keep: fewer placeholder rows and nodes
            grow, depth_cap = self.schedule.growth_limits()
            depth = min(depth, depth_cap)
        if depth <= 0 or not self._pending:  # a one-token prompt has no target rows yet
            return empty_proposal()
        t0 = time.perf_counter()
        features = self._take_pending()
        start = self.cache.length
        next_tokens = torch.tensor(tokens[start + 1 :], dtype=torch.long, device=self.head.device)
        # Over the head's own (hot) vocabulary: the same tree as over the full one, whose extra
        # columns have zero probability, without expanding and ranking them every step.
        head, n = self.head, features.shape[0]
        rows = head.pass_rows(features, next_tokens, depth - 1)
        native = head.native_pass(rows, self.cache)
        if native is not None:
            logits = head.logits((yield native)[n - 1:], full_vocab=False)
        else:
            logits = head.forward_rows(rows, n, self.cache, full_vocab=False)
        self.cache.commit_prefix(n)
        q = self._q(logits, len(tokens))
        drafted, parents, scores = grow_tree(q, grow, self.shape.width)
        if self.schedule is not None:
            n = self._schedule(scores, parents, t0)
            drafted, parents, scores = drafted[:n], parents[:n], scores[:n]
        draft_prob = node_probs(q, drafted, parents)
        tokens = torch.tensor(drafted, dtype=torch.long)
        if self.head.vocab_ids is not None:
            tokens = self.head.vocab_ids[tokens]  # columns -> token ids
        return Proposal(tokens=tokens, parents=torch.tensor(parents, dtype=torch.long), draft_prob=draft_prob)

    def _q(self, logits: torch.Tensor, index: int) -> torch.Tensor:
        """[depth, V] ranking of each depth's candidates; row d's tokens sit at sequence index `index` + d."""
        return draft_ranking(logits, self.params, self.noise, range(index, index + logits.shape[0]),
                             self.head.vocab_ids)
