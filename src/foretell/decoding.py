"""One request's decoding, as a state machine the engine drives: prefill, then plan -> (target pass) -> settle.

The target's cache holds every committed token but the last one. Each step feeds [last, d_1 .. d_n] in one
target pass: row i of its logits scores the token after d_i (row 0 the token after `last`), so n drafts are
verified and one more token is always produced. Plain decoding is the same step with n = 0.

Splitting the step around the target pass lets one driver run a request alone (Engine.stream) and another run
many requests' passes as one packed forward (batching), with the same per-request logic.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from foretell.coupled import Coupling, GumbelNoise
from foretell.drafters.base import empty_proposal, run_alone
from foretell.errors import ForetellError
from foretell.kv_cache import KVCache
from foretell.logits_process import keep_nodes, token_logprobs
from foretell.models.transformer import ForwardOutput
from foretell.prefix_cache import PrefixCache
from foretell.result_cache import merge_branch
from foretell.sampling import make_generator
from foretell.sizing.batch import truncate
from foretell.sizing.request import PassOutcome
from foretell.text import TextStream
from foretell.tree import accepted_slots, attention_mask, slot_positions
from foretell.types import Chunk, GenerationResult, GenerationStats, Proposal, SamplingParams, TokenLogprob

if TYPE_CHECKING:
    from foretell.drafters.base import Drafter
    from foretell.logits_process import LogitsProcessor
    from foretell.models.transformer import Transformer
    from foretell.result_cache import ResultCache
    from foretell.sizing.request import SizingPolicies
    from foretell.verify import Verifier


@dataclass(frozen=True)
class RequestContext:
    """What one request's decoding uses of its engine, taken once when it starts (Engine.context): the request never
    reaches back into the engine. The drafter, the result cache and the policies are the engine's own objects (a
    drafter's start makes its per-request state; the sizer is made fresh from the policies)."""

    target: Transformer
    tokenizer: object
    stop_ids: frozenset[int]
    drafter: Drafter | None
    verifier: Verifier
    processor: LogitsProcessor | None  # this request's logits processing; None: the target's logits as they are
    sizing: SizingPolicies  # each request's sizer is made fresh from them
    max_draft: int  # upper bound on draft tokens a policy may ask for
    max_proposal: int  # the largest proposal the drafter declares (tree nodes); 0 = bounded by max_draft
    drafter_layers: tuple[int, ...]  # target hidden layers the drafter reads
    result_cache: ResultCache | None = None


@dataclass
class TargetPass:
    """One request's share of a target forward.

    input_ids, positions: [T] long. tree_mask: [T, T] bool or None (causal). hidden_layers: layers whose rows the
    drafter reads. logits_rows: rows to project (slice(0, 0) in a prefill: none).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    cache: KVCache
    tree_mask: torch.Tensor | None = None
    hidden_layers: tuple[int, ...] = ()
    logits_rows: slice | None = None

    def run(self, target) -> ForwardOutput:
        return target(self.input_ids, self.positions, self.cache, tree_mask=self.tree_mask,
                      hidden_layers=self.hidden_layers, logits_rows=self.logits_rows)


@dataclass
class _Planned:
    """What plan() decided, for settle()."""

    proposal: Proposal
    drafted: bool  # the drafter ran (the draft gate may skip it)
    budget: int  # tokens the drafter was allowed (its depth for a tree; 0: no drafting)
    branch: list[int]  # the result cache's branch, [] when none
    matched: int  # the result cache key's length
    cache_nodes: list[int]  # nodes only the result cache proposed
    started: float  # perf_counter at plan() start
    planned: float  # perf_counter at plan() end


class Decoding:
    """The state of one generation under its RequestContext (an engine's drafter, policies and extras, taken once).
    How much each pass drafts is its own sizer's to say (sizing/request.py, made fresh for it); how drafts are judged,
    the context's verifier's (verify.Verifier)."""

    def __init__(self, context: RequestContext, prompt_ids: list[int], params: SamplingParams,
                 prefix_cache: PrefixCache | None = None):
        """prefix_cache: prefixes kept from earlier requests (prefix_cache.py): a kept prefix of this prompt is
        copied instead of read; this prompt is kept once read, and with its answer when it finishes."""
        window = context.target.config.context_window
        if len(prompt_ids) >= window:
            raise ForetellError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context window is {window}; "
                "shorten the prompt"
            )
        self.context, self.params = context, params
        self.t0 = time.perf_counter()
        self.ids = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.stats = GenerationStats(prompt_tokens=self.prompt_len, lossy_threshold=context.verifier.threshold)
        self.limit = min(params.max_new_tokens, window - self.prompt_len)
        capacity = self.prompt_len + self.limit + max(context.max_draft, context.max_proposal) + 1
        self.generator = make_generator(params.seed, context.target.device)
        self.noise = None  # the coupled rule's noise (coupled.py); without a seed, fresh for this request
        if params.coupled and not params.greedy:
            seed = params.seed if params.seed is not None else secrets.randbits(64)
            self.noise = GumbelNoise(seed, self.prompt_len, context.target.config.vocab_size)
        self.cache = context.target.new_cache(capacity)
        self.text = TextStream(context.tokenizer, params.stop)
        self.prefilled = 0  # prompt tokens (all but the last) in the cache
        self.done = False
        self.processor = context.processor  # None: the target's logits as they are
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs else None
        self._planned: _Planned | None = None
        # This request's sequence in the result cache: its commits go there, whatever else runs beside it.
        self.cache_sequence = context.result_cache.begin(self.ids) if context.result_cache is not None else None
        if context.drafter is not None:
            context.drafter.start(self.ids, capacity, params, self.generator)
            context.drafter.couple(self.noise)
        self.prefix_cache = prefix_cache
        self._kept_hidden: list[dict[int, torch.Tensor]] = []  # the hook rows of the cache's rows so far (to keep)
        self._looked_at = -1  # prefix_cache.kept when this request last looked for a prefix
        if prefix_cache is not None:
            self._reuse_prefix(prefix_cache)
        # how much this request drafts each pass (sizing/request.py): fresh for it, made after the drafter's start
        self.sizer = context.sizing.new_sizer(context.drafter)
        if not self.prefilling:  # a one-token prompt (or one read from the prefix cache): nothing to prefill
            self._prefilled()

    # --- prefill ----------------------------------------------------------------------------

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.prompt_len - 1

    def prefill_pass(self, chunk: int | None = None) -> TargetPass:
        """The next piece of the prompt (all of it but its last token, or `chunk` tokens of it) for the cache."""
        device = self.context.target.device
        end = self.prompt_len - 1 if chunk is None else min(self.prompt_len - 1, self.prefilled + chunk)
        return TargetPass(torch.tensor(self.ids[self.prefilled:end], device=device),
                          torch.arange(self.prefilled, end, device=device), self.cache,
                          hidden_layers=self.context.drafter_layers, logits_rows=slice(0, 0))

    def prefilled_pass(self, step: TargetPass, out: ForwardOutput) -> None:
        n = step.input_ids.numel()
        self.cache.commit_prefix(n)
        self.prefilled += n
        if out.hidden:
            self.context.drafter.observe(out.hidden)
            self._remember_hidden(out.hidden)
        if not self.prefilling:
            self._prefilled()

    @property
    def reading_from_cache(self) -> bool:
        """Whether all of its prompt in the cache so far came from the prefix cache (it has read none itself)."""
        return self.prefilled == self.stats.cached_prompt_tokens == self.cache.length

    def look_again(self) -> None:
        """Before reading any of its prompt: take a prefix kept since this request last looked (a batch admits
        requests together, and one sharing an earlier one's prompt waits for that one's rows)."""
        cache = self.prefix_cache
        if cache is None or not self.reading_from_cache or cache.kept == self._looked_at:
            return
        self._reuse_prefix(cache)
        if not self.prefilling:
            self._prefilled()

    def _reuse_prefix(self, prefix_cache: PrefixCache) -> None:
        """Start from the longest kept prefix of the prompt: its rows copied into the cache, its hook rows to the
        drafter, as if this request had read it."""
        self._looked_at = prefix_cache.kept
        layers = self.context.drafter_layers
        reused = prefix_cache.reuse(self.ids, self.cache, layers)
        if reused is None:
            return
        self.prefilled, hidden = reused  # past what an earlier look took (look_again)
        self.stats.cached_prompt_tokens = self.prefilled
        if layers:
            self.context.drafter.observe(hidden)
            self._kept_hidden.append(hidden)

    def _remember_hidden(self, hidden: dict[int, torch.Tensor]) -> None:
        if self.prefix_cache is not None:  # copies: a pass's rows are views of all its layers' states
            self._kept_hidden.append({i: rows.clone() for i, rows in hidden.items()})

    def _keep_prefix(self, length: int) -> None:
        """Offer the cache's first `length` rows (the ids before them) to the prefix cache."""
        if self.prefix_cache is None or length < self.prefix_cache.min_tokens:
            return
        hidden = {i: torch.cat([rows[i] for rows in self._kept_hidden])[:length] for i in self.context.drafter_layers}
        self.prefix_cache.keep(self.ids[:length], self.cache, hidden)

    def _prefilled(self) -> None:
        self._keep_prefix(self.prefilled)  # the prompt, for the requests that come while this one decodes
        drafter = self.context.drafter
        self.stats.cache_bytes = self.cache.nbytes() + (drafter.cache_bytes() if drafter is not None else 0)
        self.stats.prefill_seconds = time.perf_counter() - self.t0

    # --- decode steps -----------------------------------------------------------------------

    def plan(self, budget: int | None = None) -> TargetPass:
        """Draft (as the engine's configuration says, at most `budget` tokens deep when given) and return the pass
        that verifies the proposal."""
        self.draft(budget)
        return self.target_pass()

    def draft(self, budget: int | None = None) -> Proposal:
        """Run the drafter (and the engine's extras) for the next pass; the proposal waits for target_pass()."""
        return run_alone(self.draft_steps(budget))

    def draft_steps(self, budget: int | None = None):
        """draft() as a generator yielding the drafter's own forwards (DraftPass; propose_steps), so that a batch
        can pack the requests' draft forwards; returns the proposal."""
        context, t1 = self.context, time.perf_counter()
        room = self.limit - (len(self.ids) - self.prompt_len)  # tokens we may still add
        n = self.sizer.draft_tokens(room, budget)
        # a batch's 0 stops the drafter's forwards; the result cache's branch costs none, and the budget weighs its
        # nodes after drafting (branch_steps) like any other
        branch, matched = self._cache_branch(self.sizer.draft_tokens(room) if budget == 0 else n)
        drafted = n > 0 and self.sizer.should_draft(matched)
        proposal = (yield from context.drafter.propose_steps(self.ids, n)) if drafted else empty_proposal()
        if drafted and branch:
            branch = branch[:self.sizer.branch_tokens(len(branch), proposal.size, time.perf_counter() - t1)]
        proposal, cache_nodes = self._extend_proposal(proposal, branch)
        if self.processor is not None and proposal.size:
            proposal, cache_nodes = self._pruned(proposal, cache_nodes)
        self._planned = _Planned(proposal, drafted, n, branch, matched, cache_nodes, t1, time.perf_counter())
        return proposal

    @property
    def drafter_ran(self) -> bool:
        """Whether the planned proposal came from the drafter's forwards (not the result cache's branch alone)."""
        return self._planned is not None and self._planned.drafted

    def branch_steps(self) -> dict[int, float]:
        """The planned proposal's nodes only the result cache proposed, each with the chance it is accepted where
        its parent was: the branch's measured acceptance (a batch values them by it: their draft_prob is 0, the
        drafter never vouched for them)."""
        q = self.sizer.branch_acceptance()
        return {i: q for i in self._planned.cache_nodes}

    def keep(self, nodes: int) -> None:
        """Verify only the first `nodes` draft tokens of the planned proposal (a batch's budget; parents come
        before their children in every proposal, so a prefix is a valid tree)."""
        planned = self._planned
        planned.proposal = truncate(planned.proposal, nodes)
        planned.cache_nodes = [i for i in planned.cache_nodes if i < nodes]

    def target_pass(self) -> TargetPass:
        """The target pass over [last token, planned drafts...]."""
        context, proposal = self.context, self._planned.proposal
        device = context.target.device
        inputs = torch.tensor([self.ids[-1], *proposal.tokens.tolist()], device=device)
        if proposal.is_chain:
            positions = torch.arange(self.cache.length, self.cache.length + len(inputs), device=device)
            return TargetPass(inputs, positions, self.cache, hidden_layers=context.drafter_layers)
        positions = slot_positions(proposal.parents, self.cache.length).to(device)
        return TargetPass(inputs, positions, self.cache, tree_mask=attention_mask(proposal.parents),
                          hidden_layers=context.drafter_layers)

    def settle(self, out: ForwardOutput) -> Chunk:
        """Verify the planned proposal against the target pass's output, commit, and hand out the new text."""
        context, planned, stats = self.context, self._planned, self.stats
        proposal = planned.proposal
        logits = out.logits if self.processor is None else self.processor.rows(out.logits, proposal)
        coupling = Coupling(self.noise, len(self.ids)) if self.noise is not None else None  # row 0: the next index
        verdict = context.verifier(logits, proposal, self.params, self.generator, coupling)
        if proposal.is_chain:
            self.cache.commit_prefix(1 + verdict.accepted)
            committed = {layer: h[: 1 + verdict.accepted] for layer, h in out.hidden.items()}
        else:
            slots = accepted_slots(verdict.path)
            self.cache.commit_slots(slots)
            committed = {layer: h[slots.to(h.device)] for layer, h in out.hidden.items()}
        if planned.drafted and proposal.size:  # drafters that learn from timings use it
            context.drafter.verified(verdict.accepted, time.perf_counter() - planned.planned, proposal.size)
        if committed:
            context.drafter.observe(committed)
            self._remember_hidden(committed)
        t3 = time.perf_counter()
        accepted = verdict.path if verdict.path is not None else range(verdict.accepted)
        accepted_tokens = proposal.tokens[list(accepted)].tolist()
        emitted = accepted_tokens + [verdict.next_token]
        logprobs = None
        if self.logprobs is not None:  # the rows that chose each emitted token: the root's, then the path's
            rows = torch.arange(1 + verdict.accepted) if proposal.is_chain else accepted_slots(verdict.path)
            logprobs = token_logprobs(logits[rows.to(logits.device)], emitted, self.params.top_logprobs)
        from_cache = len(set(planned.cache_nodes) & set(verdict.path or ()))  # accepted nodes only the branch had
        stats.draft_seconds += planned.planned - planned.started
        stats.verify_seconds += t3 - planned.planned
        stats.target_passes += 1
        depth = proposal.depth if proposal.size else 0
        if proposal.size:
            stats.draft_tokens_verified += proposal.size
            stats.record(depth, verdict.accepted)
            stats.draft_passes += 1
            stats.passes_with_accepted += int(verdict.accepted > 0)
            stats.lossy_accepted += verdict.waived
            if planned.cache_nodes:
                stats.cache_useful += int(from_cache > 0)
                stats.cache_accepted_tokens += from_cache
        # without the drafter the pass would have committed the branch's accepted prefix + 1
        self.sizer.record(PassOutcome(planned.budget, planned.drafted, planned.matched, proposal.size, depth,
                                      verdict.accepted, t3 - planned.started,
                                      1 + _common_prefix(accepted_tokens, planned.branch),
                                      len(planned.cache_nodes), from_cache))
        chunk = self._extend(emitted, logprobs)
        if self.done:  # the prompt and the answer, for a conversation's next turn (rows past a stop token are not)
            self._keep_prefix(min(self.cache.length, len(self.ids) - 1))
        return chunk

    def _pruned(self, proposal: Proposal, cache_nodes: list[int]) -> tuple[Proposal, list[int]]:
        """The proposal less the nodes the grammar forbids; cache_nodes renumbered to the kept nodes."""
        kept = self.processor.allowed_nodes(proposal)
        if kept is None:
            return proposal, cache_nodes
        index = {old: new for new, old in enumerate(kept)}
        return keep_nodes(proposal, kept), [index[i] for i in cache_nodes if i in index]

    def _extend(self, new: list[int], logprobs: list[TokenLogprob] | None = None) -> Chunk:
        context, stats = self.context, self.stats
        room = self.limit - (len(self.ids) - self.prompt_len)
        finish = ""
        for i, token in enumerate(new):
            if token in context.stop_ids and not self.params.ignore_eos:
                new, finish = new[:i], "stop"
                break
        new = new[:room]
        self.ids.extend(new)
        if self.processor is not None:
            self.processor.commit(new)
        if logprobs is not None:
            logprobs = logprobs[:len(new)]
            self.logprobs.extend(logprobs)
        if context.result_cache is not None:
            context.result_cache.extend(self.cache_sequence, self.ids)
        stats.new_tokens = len(self.ids) - self.prompt_len
        delta = self.text.update(self.ids[self.prompt_len:])
        if self.text.stopped:
            finish = "stop"
        elif not finish and stats.new_tokens >= self.limit:
            finish = "length"
        if not finish:
            return Chunk(delta, new, logprobs=logprobs)
        self.done = True
        stats.finish_reason = finish
        stats.total_seconds = time.perf_counter() - self.t0
        result = GenerationResult(self.ids[self.prompt_len:], self.text.text, stats, self.logprobs)
        return Chunk(delta + self.text.flush(), new, result, logprobs)

    def _cache_branch(self, n: int) -> tuple[list[int], int]:
        """The opt-in result cache's branch for this pass and its key's length ([], 0 when off or no hit)."""
        if self.context.result_cache is None or n <= 0:
            return [], 0
        self.stats.cache_steps += 1
        branch, matched = self.context.result_cache.match(self.ids, n)
        self.stats.cache_hits += bool(branch)
        return branch, matched

    def _extend_proposal(self, proposal: Proposal, branch: list[int]) -> tuple[Proposal, list[int]]:
        """The opt-in extras around the drafter's proposal: the verifier refuses one it cannot judge (lossy mode
        needs draft probabilities); the result cache's branch is merged in. Returns the proposal and the nodes only
        the cache added."""
        context = self.context
        if proposal.size:
            context.verifier.check(proposal, context.drafter.name)
        if not branch:
            return proposal, []
        merged = merge_branch(proposal, branch, context.max_proposal or context.max_draft)
        return merged.proposal, merged.added


def _common_prefix(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count
