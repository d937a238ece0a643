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
rule), lossless greedy and sampled. With an AdaptiveTreeScheduler (budget auto) the scheduler's limits cap
the growth and it keeps the best-first prefix that maximises expected tokens per second on this machine.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from foretell.config import EagleTreeShape
from foretell.drafters.base import DrafterBase, empty_proposal
from foretell.drafters.tree_scheduler import AdaptiveTreeScheduler
from foretell.errors import ForetellError
from foretell.models.eagle3 import Eagle3Head
from foretell.sampling import processed_probs
from foretell.types import Proposal, SamplingParams


@dataclass
class _Nodes:
    """The grown tree: columns (draft-vocabulary indices), parents, cumulative log-probabilities and depths;
    slot[i] = the head-cache slot (after the committed rows) of node i's own row, once expanded."""

    columns: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)  # each node's own probability given its parent
    slot: dict[int, int] = field(default_factory=dict)

    def add_children(self, parent: int, q: torch.Tensor, width: int) -> list[int]:
        """The top-`width` columns of q [V_draft] as children of `parent` (-1: the root); zero-probability ones skipped."""
        top = torch.topk(q, min(width, q.shape[-1]))
        base = self.scores[parent] if parent >= 0 else 0.0
        depth = self.depths[parent] + 1 if parent >= 0 else 1
        added = []
        for p, column in zip(top.values.tolist(), top.indices.tolist()):
            if p <= 0.0:
                break
            self.columns.append(column)
            self.parents.append(parent)
            self.scores.append(base + math.log(p))
            self.depths.append(depth)
            self.probs.append(p)
            added.append(len(self.columns) - 1)
        return added

    def ancestors(self, node: int) -> list[int]:
        out = []
        while node != -1:
            out.append(node)
            node = self.parents[node]
        return out

    def best(self, limit: int) -> list[int]:
        """The `limit` best nodes, best first; parents precede children (a child's score never exceeds its
        parent's, and ties go to the shallower, then earlier node), so every prefix is closed under ancestors."""
        order = sorted(range(len(self.columns)), key=lambda i: (-self.scores[i], self.depths[i], i))
        return order[:limit]


class Eagle3Drafter(DrafterBase):
    name = "eagle3"
    sizes_itself = True  # its tree shape (or the scheduler) sets depth and size, not the engine's length policy

    def __init__(self, head: Eagle3Head, shape: EagleTreeShape = EagleTreeShape(),
                 scheduler: AdaptiveTreeScheduler | None = None):
        """With a scheduler, its node cap replaces shape.max_nodes and it picks each step's budget."""
        self.head = head
        self.shape = shape
        self.scheduler = scheduler
        self.max_nodes = scheduler.limits.max_nodes if scheduler is not None else shape.max_nodes
        self.target_layers = tuple(head.config.aux_layers)  # the engine hands us these rows after each commit
        self.cache = None
        self.params = SamplingParams()
        self._vocab_ids = head.vocab_ids.tolist()  # column -> target id
        self._pending: list[torch.Tensor] = []  # feature rows observed, not yet fed to the head
        self._observed = 0  # rows observed this generation = tokens in the target's cache
        self._sent: tuple[list[int], list[float]] = ([], [])  # the last tree's parents and scores (scheduler)

    def start(self, prompt_ids, capacity: int, params: SamplingParams, generator) -> None:
        need = capacity + self.shape.depth * self.shape.width  # room for the tree rows past the context
        if self.cache is None or self.cache.capacity < need:
            self.cache = self.head.new_cache(need)
        self.cache.truncate(0)
        self.params = params
        self._pending, self._observed = [], 0

    def observe(self, hidden: dict[int, torch.Tensor]) -> None:
        rows = self.head.features(hidden)
        self._pending.append(rows)
        self._observed += rows.shape[0]

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        """max_tokens caps the tree's depth (tokens left to generate)."""
        if self._observed != len(tokens) - 1:
            raise RuntimeError(
                f"the EAGLE-3 head saw {self._observed} target rows for {len(tokens) - 1} committed tokens; "
                "the engine must hand over every committed row (observe) before propose"
            )
        self._sent = ([], [])
        depth, grow = min(self.shape.depth, max_tokens), self.max_nodes
        if self.scheduler is not None:  # draft only what the scheduler may keep
            grow, depth_cap = self.scheduler.growth_limits()
            depth = min(depth, depth_cap)
        if depth <= 0 or not self._pending:  # a one-token prompt has no target rows yet
            return empty_proposal()
        t0 = time.perf_counter()
        root_state, root_q = self._feed_context(tokens)
        nodes = self._grow(root_state, root_q, depth, len(tokens) - 2)
        keep = nodes.best(grow)
        if self.scheduler is not None:
            n = self.scheduler.choose([nodes.scores[i] for i in keep], self._parents(nodes, keep),
                                      time.perf_counter() - t0)
            keep = keep[:n]
            self._sent = (self._parents(nodes, keep), [nodes.scores[i] for i in keep])
        return self._proposal(nodes, keep)

    # --- pieces --------------------------------------------------------------------------

    def _feed_context(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed and commit the pending rows; the last row's output and depth-1 distribution."""
        features = torch.cat(self._pending)
        self._pending = []
        start, n = self.cache.length, features.shape[0]
        head = self.head
        hidden = head.fc(features.to(head.dtype))
        next_tokens = torch.tensor(tokens[start + 1 :], dtype=torch.long, device=head.device)
        positions = torch.arange(start, start + n, device=head.device)
        out = head.step(next_tokens, hidden, positions, self.cache)
        self.cache.commit_prefix(n)
        state = out[-1]
        return state, self._q(head.logits(state))

    def _grow(self, root_state: torch.Tensor, root_q: torch.Tensor, depth: int, last_row: int) -> _Nodes:
        """EAGLE-2: expand the best `width` nodes of each new level, one head step per level. last_row: the
        position of the last committed row (the one that drafted depth 1); a depth-d node's row sits d after it."""
        nodes = _Nodes()
        context = self.cache.length
        width = self.shape.width
        level = nodes.add_children(-1, root_q, width)
        states = {-1: root_state}  # node -> the output of its own row (its children's parent state)
        for _ in range(depth - 1):
            expand = sorted(level, key=lambda i: (-nodes.scores[i], i))[:width]
            if not expand:
                break
            outputs = self._step_nodes(nodes, expand, states, last_row)
            q = self._q(self.head.logits(outputs))
            level = []
            for row, node in enumerate(expand):
                states[node] = outputs[row]
                level.extend(nodes.add_children(node, q[row], width))
        self.cache.truncate(context)  # drop the tree rows; the next proposal feeds what was accepted
        return nodes

    def _step_nodes(self, nodes: _Nodes, expand: list[int], states: dict, last_row: int) -> torch.Tensor:
        """One head step over the nodes `expand`: each sees the committed rows, its ancestors' rows and itself."""
        for node in expand:
            nodes.slot[node] = len(nodes.slot)
        mask = torch.zeros(len(expand), len(nodes.slot), dtype=torch.bool)
        for row, node in enumerate(expand):
            mask[row, [nodes.slot[a] for a in nodes.ancestors(node) if a in nodes.slot]] = True
        head = self.head
        tokens = torch.tensor([self._vocab_ids[nodes.columns[i]] for i in expand], dtype=torch.long, device=head.device)
        hidden = torch.stack([states[nodes.parents[i]] for i in expand])
        positions = torch.tensor([last_row + nodes.depths[i] for i in expand], device=head.device)
        out = head.step(tokens, hidden, positions, self.cache, tree_mask=mask)
        self.cache.commit_prefix(len(expand))  # kept until the tree is done (truncated in _grow)
        return out

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        # Rank under the user's temperature / top-k / top-p; greedy ranks by softmax.
        params = self.params if not self.params.greedy else SamplingParams(temperature=1.0)
        return processed_probs(logits, params)

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

    def cache_bytes(self) -> int:
        return self.cache.nbytes() if self.cache is not None else 0

    def modules(self) -> tuple[torch.nn.Module, ...]:
        return (self.head,)

    def verified(self, accepted: int, verify_seconds: float, verified_nodes: int) -> None:
        """The engine's report on the last proposal (accepted path length, the pass's time and size)."""
        if self.scheduler is not None and self._sent[0]:
            self.scheduler.record(*self._sent, accepted, verify_seconds, verified_nodes)
