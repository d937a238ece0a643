"""A draft model that grows a token tree, level by level, one draft forward per level.

Two shapes:
- static: `branching[d]` children for every node at depth d (all nodes expanded);
- dynamic (EAGLE-2): at each depth expand the `top_k` nodes with the highest cumulative draft
  log-probability, each into its `top_k` best children; finally keep the `total_tokens` best
  nodes of the whole tree (closed under ancestors) for one verification pass.

Children are the top-k of the draft distribution (deterministic: verified with the EAGLE
rule), or, for static trees, k i.i.d. samples from it (verified with SpecInfer's rule). Pruning
by value would break the i.i.d. assumption, so dynamic trees always use top-k children. Under the
coupled rule (coupled.py) children are the top-k of draft_ranking, which uses the verifier's noise.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from foretell.config import TreeShape
from foretell.coupled import draft_ranking
from foretell.drafters.base import run_alone
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.tree import path_to
from foretell.types import Proposal, SamplingParams

if TYPE_CHECKING:
    from foretell.sizing.tree import LevelBudget


@dataclass
class _Growth:
    """Nodes grown so far; node i's draft row (if expanded) sits at cache slot tree_start + slot[i]."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # cumulative draft log-probability
    q_rows: list[torch.Tensor] = field(default_factory=list)  # distribution each node was drawn from
    slot: dict[int, int] = field(default_factory=dict)

    def add(self, token: int, parent: int, score: float, q: torch.Tensor) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.scores.append(score)
        self.q_rows.append(q)
        return len(self.tokens) - 1


class DraftTreeDrafter(DraftModelDrafter):
    """With a `budget` (sizing/tree.LevelBudget: the target's measured cost curve), a dynamic tree is hardware-aware:
    it stops growing when another level is not worth its draft time, and verifies the number of
    nodes that maximises expected tokens per second; `shape.depth` and `shape.total_tokens`
    become upper bounds. Node values are the draft's path probabilities exp(score)."""

    name = "draft-tree"
    sizes_itself = True  # its shape (or the hardware-aware tuner) sets depth and size, not the length policy

    def __init__(
        self, model, target_vocab_size: int, shape: TreeShape = TreeShape(), budget: LevelBudget | None = None,
        hot=None,
    ):
        super().__init__(model, target_vocab_size, hot)
        self.shape = shape
        self.budget = budget  # sizing/tree.LevelBudget (budget auto), or None: the shape's fixed size
        self.max_nodes = shape.max_nodes
        self.last_budget = 0  # nodes verified in the last proposal (reported by benchmarks)
        self._level_seconds: float | None = None  # the last draft level's forward time

    def start(self, prompt_ids, capacity: int, params: SamplingParams, generator) -> None:
        # The tree's expanded nodes sit in the draft cache while it grows.
        super().start(prompt_ids, capacity + self.shape.max_nodes * max(self.shape.top_k, max(self.shape.branching)), params, generator)

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        return run_alone(self.propose_steps(tokens, max_tokens))

    def propose_steps(self, tokens: list[int], max_tokens: int):
        """The tree, one draft forward a level, each yielded (a batch packs the requests' forwards level by level).
        max_tokens caps the tree's depth (tokens left to generate)."""
        depth = min(self.shape.max_depth, max_tokens)
        if depth <= 0:
            return Proposal(tokens=torch.empty(0, dtype=torch.long))
        t0 = time.perf_counter()
        root_q = self._q((yield from self._step_steps(self._sync(tokens))), len(tokens))
        tree_start = self.cache.length
        grown = _Growth()
        frontier = [(-1, root_q)]
        for d in range(depth):
            new_nodes = self._expand(grown, frontier, d)
            if d + 1 == depth:
                break
            chosen = self._to_expand(grown, new_nodes)
            if self.budget is not None and not self._worth_another_level(grown, chosen, t0):
                break
            t_level = time.perf_counter()
            logits = yield from self._feed_nodes(grown, chosen, len(tokens) - 1, tree_start)
            q = self._q(logits, len(tokens) + d + 1)
            frontier = list(zip(chosen, q))
            self._level_seconds = time.perf_counter() - t_level
        self.cache.truncate(tree_start)  # drop the tree; the next sync re-feeds what was accepted
        return self._proposal(grown, time.perf_counter() - t0)

    def _values(self, grown: _Growth) -> list[float]:
        return sorted((math.exp(s) for s in grown.scores), reverse=True)

    def _worth_another_level(self, grown: _Growth, chosen: list[int], t0: float) -> bool:
        elapsed = time.perf_counter() - t0
        level_seconds = self._level_seconds if self._level_seconds is not None else elapsed
        values = self._values(grown)[: self.shape.total_tokens]
        # Children of the expanded nodes can add at most the expanded nodes' own values.
        gain = sum(math.exp(grown.scores[c]) for c in chosen)
        return self.budget.worth_another_level(values, gain, len(chosen), elapsed, level_seconds)

    def _q(self, logits: torch.Tensor, index: int) -> torch.Tensor:
        """Children's ranking (static trees also sample them from it); `index`: the children's sequence index."""
        return draft_ranking(logits, self.params, self.noise, index)

    @property
    def _sampled(self) -> bool:
        """Children drawn i.i.d. from q (verified with SpecInfer's rule); the coupled rule ranks them instead."""
        return self.shape.children == "sampled" and not self.params.greedy and self.noise is None

    def _expand(self, grown: _Growth, frontier, d: int) -> list[int]:
        k = self.shape.branching[d] if self.shape.kind == "static" else self.shape.top_k
        new_nodes = []
        for parent, q in frontier:
            if self._sampled:
                picks = torch.multinomial(q, k, replacement=True, generator=self.generator).tolist()
            else:
                picks = torch.topk(q, k).indices.tolist()
            base = grown.scores[parent] if parent >= 0 else 0.0
            for t in picks:
                new_nodes.append(grown.add(t, parent, base + float(torch.log(q[t].clamp_min(1e-30))), q))
        return new_nodes

    def _to_expand(self, grown: _Growth, new_nodes: list[int]) -> list[int]:
        if self.shape.kind == "static":
            return new_nodes
        return sorted(new_nodes, key=lambda n: -grown.scores[n])[: self.shape.top_k]

    def _feed_nodes(self, grown: _Growth, nodes: list[int], root_position: int, tree_start: int):
        """One draft forward over `nodes` (yielded); each sees the committed prefix and its own ancestors."""
        before = len(grown.slot)
        for n in nodes:
            grown.slot[n] = len(grown.slot)
        mask = torch.zeros(len(nodes), len(grown.slot), dtype=torch.bool)
        depths = []
        for row, n in enumerate(nodes):
            chain = path_to(n, grown.parents)
            mask[row, [grown.slot[a] for a in chain]] = True
            depths.append(len(chain))
        device = self.model.device
        ids = torch.tensor([grown.tokens[n] for n in nodes], device=device)
        positions = torch.tensor(depths, device=device) + root_position
        assert self.cache.length == tree_start + before
        logits = yield from self._logits_steps(ids, positions, tree_mask=mask)
        self.cache.commit_prefix(len(nodes))
        return logits

    def _proposal(self, grown: _Growth, draft_seconds: float) -> Proposal:
        keep = list(range(len(grown.tokens)))
        budget = self.shape.total_tokens
        if self.shape.kind == "dynamic" and self.budget is not None:
            budget, _ = self.budget.best(self._values(grown)[: self.shape.total_tokens], draft_seconds)
        if self.shape.kind == "dynamic" and len(keep) > budget:
            # Scores only fall along a path and the sort is stable (parents have lower indices),
            # so the best N nodes already include every ancestor of each one.
            keep = sorted(sorted(keep, key=lambda n: -grown.scores[n])[:budget])
        self.last_budget = len(keep)
        index = {old: new for new, old in enumerate(keep)}  # keep is sorted: parents stay earlier
        tokens = torch.tensor([grown.tokens[n] for n in keep], dtype=torch.long)
        parents = torch.tensor([index[grown.parents[n]] if grown.parents[n] >= 0 else -1 for n in keep])
        q = torch.stack([grown.q_rows[n] for n in keep]) if self._sampled else None
        # Each node's own draft probability: its score (cumulative log q) less its parent's.
        draft_prob = torch.tensor([
            math.exp(grown.scores[n] - (grown.scores[grown.parents[n]] if grown.parents[n] >= 0 else 0.0)) for n in keep
        ])
        return Proposal(tokens=tokens, q=q, parents=parents, draft_prob=draft_prob)
