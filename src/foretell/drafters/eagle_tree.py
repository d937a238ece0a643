"""The EAGLE-3 drafter: an EAGLE-2 dynamic tree grown by an EAGLE-3 head, one head step per level.

The head (models/eagle3.py) reads the target's aux-layer hidden states of the committed tokens through
the engine's hook (`target_layers` / `observe`). A proposal first feeds the rows committed since the last
one (each: fc of the target's features at i with the embedding of token i + 1) and commits them to the
head's cache; the last row's output drafts depth 1. Then, level by level (EAGLE-2), the `width` nodes of
the newest level with the highest cumulative log-probability are expanded: one head step over those nodes
(each the embedding of its token with the output of the row that drafted it, `depth` positions after the
last committed row, seeing the committed rows and its own ancestors' rows: a tree mask on the head's cache) gives each its
`width` best children. Finally the `max_nodes` best nodes of the grown tree (closed under ancestors) are
proposed, best first; the tree rows are dropped from the head's cache.

Children are the top-k of the head's distribution under the user's temperature / top-k / top-p
(deterministic), so proposals carry no q rows: the tree verifier treats them as point masses (the EAGLE
rule), lossless greedy and sampled; under the coupled rule (coupled.py) they are ranked with the verifier's
noise (draft_ranking). With an AdaptiveTreeScheduler (budget auto) the scheduler's limits cap
the growth and it keeps the best-first prefix that maximises expected tokens per second on this machine.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generator

import torch

from foretell.config import EagleTreeShape
from foretell.coupled import draft_ranking
from foretell.drafters.base import empty_proposal, run_alone
from foretell.drafters.hooked_tree import HookedTreeDrafter
from foretell.errors import ForetellError
from foretell.models.eagle3 import Eagle3Head
from foretell.runtime.lean_drafters import HeadStepPass
from foretell.types import Proposal, SamplingParams

if TYPE_CHECKING:
    from foretell.sizing.tree import AdaptiveTreeScheduler


@dataclass
class _Nodes:
    """The grown tree: columns (draft-vocabulary indices), parents, cumulative log-probabilities and depths;
    seen[i] = the head-cache slots (after the committed rows) node i's row sees once expanded: its expanded
    ancestors' rows and, last, its own (slots are given in the order nodes are expanded)."""

    columns: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)  # each node's own probability given its parent
    seen: dict[int, list[int]] = field(default_factory=dict)

    def expand(self, node: int) -> list[int]:
        """Give `node` the next head-cache slot; returns seen[node] (a node is expanded only after its parent, whose
        path is already known)."""
        self.seen[node] = self.seen.get(self.parents[node], []) + [len(self.seen)]
        return self.seen[node]

    def add_top(self, parent: int, probs: list[float], columns: list[int]) -> list[int]:
        """Children of `parent` from a top-k already taken (probabilities descending, their columns)."""
        base = self.scores[parent] if parent >= 0 else 0.0
        depth = self.depths[parent] + 1 if parent >= 0 else 1
        added = []
        for p, column in zip(probs, columns):
            if p <= 0.0:
                break
            self.columns.append(column)
            self.parents.append(parent)
            self.scores.append(base + math.log(p))
            self.depths.append(depth)
            self.probs.append(p)
            added.append(len(self.columns) - 1)
        return added

    def rank(self, i: int) -> tuple[float, int, int]:
        """Node i's place in `best`'s order (lower first)."""
        return -self.scores[i], self.depths[i], i

    def best(self, limit: int) -> list[int]:
        """The `limit` best nodes, best first; parents precede children (a child's score never exceeds its
        parent's, and ties go to the shallower, then earlier node), so every prefix is closed under ancestors."""
        return sorted(range(len(self.columns)), key=self.rank)[:limit]

    def worth_expanding(self, level: list[int], width: int, limit: int) -> list[int]:
        """EAGLE-2's `width` best nodes of the newest level, less those already outside the `limit` best nodes
        of the tree: nodes only join a tree, and a child ranks after its parent, so such a node and all its
        descendants stay out of best(limit), and its head row would be drafted for nothing. The proposal
        (best(limit)) is the same as with every one expanded."""
        expand = sorted(level, key=self.rank)[:width]
        if len(self.columns) <= limit or not expand:
            return expand
        cutoff = sorted(self.rank(i) for i in range(len(self.columns)))[limit - 1]
        return [i for i in expand if self.rank(i) <= cutoff]


class Eagle3Drafter(HookedTreeDrafter):
    name = "eagle3"
    what = "EAGLE-3 head"

    def __init__(self, head: Eagle3Head, shape: EagleTreeShape = EagleTreeShape(),
                 scheduler: AdaptiveTreeScheduler | None = None):
        """With a scheduler, its node cap replaces shape.max_nodes and it picks each step's budget."""
        super().__init__(head, scheduler, shape.max_nodes, head.config.aux_layers)
        self.head, self.shape = head, shape
        self._ids = head.vocab_ids  # column -> target id
        self._vocab_ids = self._ids.tolist()

    def start(self, prompt_ids, capacity: int, params: SamplingParams, generator) -> None:
        self._new_generation(capacity + self.shape.depth * self.shape.width, params)  # room for the tree rows

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        """max_tokens caps the tree's depth (tokens left to generate)."""
        return run_alone(self.propose_steps(tokens, max_tokens))

    def propose_steps(self, tokens: list[int], max_tokens: int) -> Generator[HeadStepPass, Any, Proposal]:
        """propose(), yielding each of the head's steps (a batch packs the requests' steps: run_together)."""
        self._check_observed(tokens)
        self._sent = ([], [])
        depth, grow = min(self.shape.depth, max_tokens), self.max_nodes
        if self.schedule is not None:  # draft only what the scheduler may keep
            grow, depth_cap = self.schedule.growth_limits()
            depth = min(depth, depth_cap)
        if depth <= 0 or not self._pending:  # a one-token prompt has no target rows yet
            return empty_proposal()
        t0 = time.perf_counter()
        root_state, root_logits = yield from self._feed_context(tokens)
        level_times = [time.perf_counter()]  # depth 1 is ready; _grow adds the time of each next level
        nodes = yield from self._grow(root_state, root_logits, depth, len(tokens) - 2, level_times, grow)
        keep = nodes.best(grow)
        if self.schedule is not None:
            keep = keep[: self._schedule([nodes.scores[i] for i in keep], self._parents(nodes, keep), t0,
                                         level_times)]
        return self._proposal(nodes, keep)

    # --- pieces --------------------------------------------------------------------------

    def _feed_context(self, tokens: list[int]):
        """Feed and commit the pending rows; the last row's output and draft logits [1, V_draft] (depth 1)."""
        features = self._take_pending()
        start, n = self.cache.length, features.shape[0]
        head = self.head
        hidden = head.fuse(features)
        next_tokens = torch.tensor(tokens[start + 1 :], dtype=torch.long, device=head.device)
        positions = torch.arange(start, start + n, device=head.device)
        out, logits = yield HeadStepPass(head, next_tokens, hidden, positions, self.cache, last_only=True)
        self.cache.commit_prefix(n)
        return out[-1], logits[-1:]

    def _grow(self, root_state: torch.Tensor, root_logits: torch.Tensor, depth: int, last_row: int,
              level_times: list[float], limit: int) -> Generator[HeadStepPass, Any, _Nodes]:
        """EAGLE-2: expand the best `width` nodes of each new level that can still be among the `limit` proposed
        (_Nodes.worth_expanding), one head step per level. last_row: the position of the last committed row (the
        one that drafted depth 1); a depth-d node's row sits d after it. Appends to level_times when each new
        level is ready (the scheduler charges a tree its levels' time)."""
        nodes = _Nodes()
        context = self.cache.length
        width = self.shape.width
        probs, columns = self._top(root_logits, width, last_row + 2)
        level = nodes.add_top(-1, probs[0], columns[0])
        states = {-1: root_state}  # node -> the output of its own row (its children's parent state)
        for _ in range(depth - 1):
            expand = nodes.worth_expanding(level, width, limit)
            if not expand:
                break
            outputs, logits = yield from self._step_nodes(nodes, expand, states, last_row)
            # every expanded node's children at once (one level: their sequence index is the same)
            probs, columns = self._top(logits, width, last_row + 2 + nodes.depths[expand[0]])
            level = []
            for row, node in enumerate(expand):
                states[node] = outputs[row]
                level.extend(nodes.add_top(node, probs[row], columns[row]))
            level_times.append(time.perf_counter())
        self.cache.truncate(context)  # drop the tree rows; the next proposal feeds what was accepted
        return nodes

    def _step_nodes(self, nodes: _Nodes, expand: list[int], states: dict, last_row: int
                    ) -> Generator[HeadStepPass, Any, tuple[torch.Tensor, torch.Tensor]]:
        """One head step over the nodes `expand`: each sees the committed rows, its ancestors' rows and itself.
        Returns their outputs and draft logits."""
        paths = [nodes.expand(node) for node in expand]
        rows = [[False] * len(nodes.seen) for _ in expand]
        for row, path in zip(rows, paths):
            for slot in path:
                row[slot] = True
        mask = torch.tensor(rows, dtype=torch.bool)  # one tensor from Python lists: a torch call per row costs more
        head = self.head
        tokens = torch.tensor([self._vocab_ids[nodes.columns[i]] for i in expand], dtype=torch.long, device=head.device)
        hidden = torch.stack([states[nodes.parents[i]] for i in expand])
        positions = torch.tensor([last_row + nodes.depths[i] for i in expand], device=head.device)
        out = yield HeadStepPass(head, tokens, hidden, positions, self.cache, tree_mask=mask)
        self.cache.commit_prefix(len(expand))  # kept until the tree is done (truncated in _grow)
        return out

    def _top(self, logits: torch.Tensor, width: int, index: int) -> tuple[list[list[float]], list[list[int]]]:
        """Each row's `width` best children under the user's sampling settings (coupled.draft_ranking; `index`: the
        children's sequence index): probabilities, draft columns."""
        ranked = draft_ranking(logits, self.params, self.noise, index, self._ids)
        top = torch.topk(ranked, min(width, logits.shape[-1]))
        return top.values.tolist(), top.indices.tolist()

    @staticmethod
    def _parents(nodes: _Nodes, keep: list[int]) -> list[int]:
        index = {old: new for new, old in enumerate(keep)}
        return [index[nodes.parents[i]] if nodes.parents[i] >= 0 else -1 for i in keep]

    def _proposal(self, nodes: _Nodes, keep: list[int]) -> Proposal:
        if not keep:
            return empty_proposal()
        parents = self._parents(nodes, keep)
        if any(p >= i for i, p in enumerate(parents)):
            raise ForetellError("internal error: the eagle3 tree is not in topological order")
        return Proposal(
            tokens=torch.tensor([self._vocab_ids[nodes.columns[i]] for i in keep], dtype=torch.long),
            parents=torch.tensor(parents, dtype=torch.long),
            draft_prob=torch.tensor([nodes.probs[i] for i in keep]),
        )
