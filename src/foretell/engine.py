"""The decode loop, and its only owner: prefill -> propose -> verify -> commit -> stream.

The target's cache holds every committed token but the last one. Each step feeds
[last, d_1 .. d_n] in one target pass: row i of its logits scores the token after d_i
(row 0 the token after `last`), so n drafts are verified and one more token is always
produced. Plain decoding is the same loop with n = 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from foretell.draft_gate import DraftGate
from foretell.drafters.base import Drafter, empty_proposal
from foretell.drafters.length_policy import DraftLengthPolicy, FixedLength
from foretell.errors import ForetellError
from foretell.lossy import check_lossy_threshold, verify_controlled
from foretell.models.transformer import Transformer, warm_up
from foretell.result_cache import ResultCache, merge_branch
from foretell.sampling import make_generator
from foretell.text import TextStream
from foretell.types import GenerationStats, SamplingParams
from foretell.tree import accepted_slots, attention_mask, slot_positions
from foretell.verify import verify


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only
    text: str
    stats: GenerationStats


@dataclass
class Chunk:
    """One streamed step: the text and tokens it added; `result` is set on the last chunk."""

    text: str
    tokens: list[int]
    result: GenerationResult | None = None


@dataclass
class Engine:
    target: Transformer
    tokenizer: object
    stop_ids: set[int]
    drafter: Drafter | None = None
    length_policy: DraftLengthPolicy = field(default_factory=FixedLength)
    max_draft: int = 16  # upper bound on draft tokens a policy may ask for
    # Opt-in, both off by default: LOSSY verification (lossy.py: a draft path probability above
    # the threshold skips the target's check) and the result cache (result_cache.py).
    lossy_threshold: float | None = None
    result_cache: ResultCache | None = None
    # Hardware-aware, lossless: whether a tree drafter runs at all each pass (draft_gate.py).
    draft_gate: DraftGate | None = None

    def __post_init__(self):
        self.lossy_threshold = check_lossy_threshold(self.lossy_threshold)
        name = self.drafter.name if self.drafter is not None else "none"
        for extra, why in ((self.draft_gate, "the draft gate skips passes of"),
                           (self.result_cache, "the result cache merges its branch into a tree proposal, so it needs")):
            if extra is not None and not (self.drafter is not None and self.drafter.sizes_itself):
                raise ForetellError(f"{why} a tree drafter (draft-tree, parallel-head, hidden-state), not {name}")

    @property
    def context_window(self) -> int:
        return self.target.config.max_position_embeddings

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        for chunk in self.stream(prompt_ids, params):
            if chunk.result is not None:
                return chunk.result
        raise AssertionError("stream ended without a result")

    def warm_up(self, sizes: tuple[int, ...] = (1, 2, 3, 4, 5)) -> None:
        """Throw-away forwards of the shapes decoding uses: the first call of each shape pays
        for page-ins of fresh weights and kernel set-up, which would otherwise land in the
        first generation's timings."""
        sizes = (*sizes, self._max_proposal + 1)
        with torch.inference_mode():
            warm_up(self.target, sorted(set(sizes)))
        if self.drafter is not None:
            self.drafter.warm_up()

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        with torch.inference_mode():
            yield from self._loop(list(prompt_ids), params)

    def _loop(self, ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        if len(ids) >= self.context_window:
            raise ForetellError(
                f"the prompt has {len(ids)} tokens but the model's context window is {self.context_window}; "
                "shorten the prompt"
            )
        t0 = time.perf_counter()
        stats = GenerationStats(prompt_tokens=len(ids), lossy_threshold=self.lossy_threshold)
        if self.result_cache is not None:
            self.result_cache.begin(ids)
        if self.draft_gate is not None:
            self.draft_gate.begin()
        limit = min(params.max_new_tokens, self.context_window - len(ids))
        capacity = len(ids) + limit + max(self.max_draft, self._max_proposal) + 1
        device = self.target.device
        generator = make_generator(params.seed, device)
        cache = self.target.new_cache(capacity)
        prompt_hidden: dict[int, torch.Tensor] = {}
        if len(ids) > 1:
            prompt_hidden = self.target(
                torch.tensor(ids[:-1], device=device), torch.arange(len(ids) - 1, device=device), cache,
                hidden_layers=self._drafter_layers, logits_rows=slice(0, 0),
            ).hidden
            cache.commit_prefix(len(ids) - 1)
        if self.drafter is not None:
            self.drafter.start(ids, capacity, params, generator)
        if prompt_hidden:
            self.drafter.observe(prompt_hidden)
        stats.cache_bytes = cache.nbytes() + (self.drafter.cache_bytes() if self.drafter is not None else 0)
        stats.prefill_seconds = time.perf_counter() - t0

        prompt_len = len(ids)
        text = TextStream(self.tokenizer, params.stop)
        while True:
            room = limit - (len(ids) - prompt_len)  # tokens we may still add
            n = self._draft_budget(room) if self.drafter else 0
            t1 = time.perf_counter()
            branch, matched = self._cache_branch(ids, n, stats)
            drafted = n > 0 and (self.draft_gate is None or self.draft_gate.should_draft(matched))
            proposal = self.drafter.propose(ids, n) if drafted else empty_proposal()
            proposal, cache_nodes = self._extend_proposal(proposal, branch)
            t2 = time.perf_counter()
            verdict, committed_hidden = self._verify(ids[-1], proposal, cache, params, generator)
            if drafted and proposal.size:  # drafters that learn from timings use it
                self.drafter.verified(verdict.accepted, time.perf_counter() - t2, proposal.size)
            if committed_hidden:
                self.drafter.observe(committed_hidden)
            t3 = time.perf_counter()
            accepted = verdict.path if verdict.path is not None else range(verdict.accepted)
            accepted_tokens = proposal.tokens[list(accepted)].tolist()
            if self.draft_gate is not None and n > 0:  # without the drafter: the branch's accepted prefix + 1
                self.draft_gate.record(matched, drafted, 1 + verdict.accepted, t3 - t1,
                                       1 + _common_prefix(accepted_tokens, branch))
            stats.draft_seconds += t2 - t1
            stats.verify_seconds += t3 - t2
            stats.target_passes += 1
            if proposal.size:
                stats.draft_tokens_verified += proposal.size
                depth = proposal.depth
                stats.record(depth, verdict.accepted)
                self.length_policy.update(depth, verdict.accepted)
                stats.draft_passes += 1
                stats.passes_with_accepted += int(verdict.accepted > 0)
                stats.lossy_accepted += verdict.waived
                if cache_nodes:
                    from_cache = len(set(cache_nodes) & set(verdict.path or ()))
                    stats.cache_useful += int(from_cache > 0)
                    stats.cache_accepted_tokens += from_cache

            new = [*accepted_tokens, verdict.next_token]
            finish = ""
            for i, token in enumerate(new):
                if token in self.stop_ids and not params.ignore_eos:
                    new, finish = new[:i], "stop"
                    break
            new = new[:room]
            ids.extend(new)
            if self.result_cache is not None:
                self.result_cache.extend(ids)
            stats.new_tokens = len(ids) - prompt_len
            delta = text.update(ids[prompt_len:])
            if text.stopped:
                finish = "stop"
            elif not finish and stats.new_tokens >= limit:
                finish = "length"
            if finish:
                stats.finish_reason = finish
                stats.total_seconds = time.perf_counter() - t0
                result = GenerationResult(ids[prompt_len:], text.text, stats)
                yield Chunk(delta + text.flush(), new, result)
                return
            yield Chunk(delta, new)

    @property
    def _drafter_layers(self) -> tuple[int, ...]:
        """Target hidden layers the drafter reads; () costs nothing extra."""
        return self.drafter.target_layers if self.drafter is not None else ()

    @property
    def _max_proposal(self) -> int:
        """The largest proposal the drafter declares (tree nodes); 0 = bounded by max_draft."""
        return self.drafter.max_nodes if self.drafter is not None else 0

    def _draft_budget(self, room: int) -> int:
        """Tokens the drafter may propose (for a tree: its depth); never past the token limit."""
        if self.drafter.sizes_itself:
            return room - 1
        return min(self.length_policy.next_length(), self.max_draft, room - 1)

    def _cache_branch(self, ids: list[int], n: int, stats: GenerationStats) -> tuple[list[int], int]:
        """The opt-in result cache's branch for this pass and its key's length ([], 0 when off or no hit)."""
        if self.result_cache is None or n <= 0:
            return [], 0
        stats.cache_steps += 1
        branch, matched = self.result_cache.match(ids, n)
        stats.cache_hits += bool(branch)
        return branch, matched

    def _extend_proposal(self, proposal, branch: list[int]):
        """The opt-in extras around the drafter's proposal: lossy mode needs its draft probabilities;
        the result cache's branch is merged in. Returns the proposal and the nodes only the cache added."""
        if self.lossy_threshold is not None and proposal.size and proposal.draft_prob is None:
            raise ForetellError(
                f"lossy verification needs per-node draft probabilities (Proposal.draft_prob), which the "
                f"{self.drafter.name} drafter does not provide; use parallel-head, draft-model, draft-tree or "
                "hidden-state, or leave lossy_threshold off"
            )
        if not branch:
            return proposal, []
        merged = merge_branch(proposal, branch, self._max_proposal or self.max_draft)
        return merged.proposal, merged.added

    def _judge(self, logits, proposal, params: SamplingParams, generator):
        """The verification controller: lossless `verify` unless the opt-in lossy mode is on."""
        if self.lossy_threshold is None:
            return verify(logits, proposal, params, generator)
        return verify_controlled(logits, proposal, params, generator, self.lossy_threshold)

    def _verify(self, last_token: int, proposal, cache, params: SamplingParams, generator):
        """One target pass over [last, drafts...]; keep the accepted slots in the cache.

        Returns the verdict and, for a drafter with `target_layers`, those layers' hidden rows of
        the slots just committed (the root, then the accepted drafts), in sequence order.
        """
        device = self.target.device
        layers = self._drafter_layers
        inputs = torch.tensor([last_token, *proposal.tokens.tolist()], device=device)
        if proposal.is_chain:
            positions = torch.arange(cache.length, cache.length + len(inputs), device=device)
            out = self.target(inputs, positions, cache, hidden_layers=layers)
            verdict = self._judge(out.logits, proposal, params, generator)
            cache.commit_prefix(1 + verdict.accepted)
            return verdict, {layer: h[: 1 + verdict.accepted] for layer, h in out.hidden.items()}
        positions = slot_positions(proposal.parents, cache.length).to(device)
        out = self.target(inputs, positions, cache, tree_mask=attention_mask(proposal.parents), hidden_layers=layers)
        verdict = self._judge(out.logits, proposal, params, generator)
        slots = accepted_slots(verdict.path)
        cache.commit_slots(slots)
        return verdict, {layer: h[slots.to(h.device)] for layer, h in out.hidden.items()}


def _common_prefix(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count
