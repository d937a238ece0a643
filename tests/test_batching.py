"""Continuous batching: every request's output is what it would be alone (greedy exactly in fp32, sampled in
distribution), whatever shares its batch; requests join, finish, fail and are cancelled without disturbing the
others; long prompts are read in chunks; the budget policies."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import PROMPTS
from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models.eagle3 import new_eagle3_head, save_eagle3_head
from foretell.models.hidden_draft import new_hidden_draft, save_hidden_draft
from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head, save_parallel_head
from foretell.prefix_cache import PrefixCache
from foretell.result_cache import ResultCache
from foretell.sizing.batch import BatchAwareBudget, FixedByBatchSize, chain_values, node_values, truncate
from foretell.types import Proposal, SamplingParams


class Collector:
    def __init__(self):
        self.tokens: list[int] = []
        self.result = None
        self.error: Exception | None = None

    def chunk(self, c):
        self.tokens += c.tokens
        if c.result is not None:
            self.result = c.result

    def fail(self, e):
        self.error = e


def submit(batch, prompt, params, engine=None) -> Collector:
    c = Collector()
    batch.submit(prompt, params, c.chunk, c.fail, engine)
    return c


@pytest.fixture(scope="module")
def pipes(tiny_pair, tmp_path_factory):
    """The same tiny target under several configurations (weights shared)."""
    plain = load(tiny_pair[0], "none", warm_up=False)
    target = plain.target.model
    folder = tmp_path_factory.mktemp("batch")
    head = save_parallel_head(new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=3),
                              folder / "head")
    hidden = save_hidden_draft(new_hidden_draft(target, seed=3), folder / "hidden")
    eagle = save_eagle3_head(new_eagle3_head(target, seed=3), folder / "eagle3")
    specs = {
        "none": SpeculativeConfig(method="none"),
        "prompt-lookup": SpeculativeConfig(gamma=3),
        "draft-model": SpeculativeConfig(method="draft-model", model=str(tiny_pair[1]), gamma=3, draft_quant="none"),
        "draft-tree": SpeculativeConfig(method="draft-tree", model=str(tiny_pair[1]), draft_quant="none"),
        "parallel-head": SpeculativeConfig(method="parallel-head", model=str(head), result_cache="prompt"),
        "hidden-state": SpeculativeConfig(method="hidden-state", model=str(hidden)),
        "eagle3": SpeculativeConfig(method="eagle3", model=str(eagle)),
    }
    return {name: plain.with_speculative(spec) for name, spec in specs.items()}


GREEDY = SamplingParams(max_new_tokens=30, ignore_eos=True)


@pytest.mark.parametrize("budget", [None, "batch-aware", "fixed"])
def test_each_request_decodes_as_if_alone(pipes, budget):
    """Greedy fp32: a prompt's output beside three other requests (other drafters, temperatures, lengths) equals
    its output alone, for every drafter."""
    policy = {None: None, "batch-aware": BatchAwareBudget(cost=lambda n: 1.0 + 0.02 * n),
              "fixed": FixedByBatchSize()}[budget]
    sampled = SamplingParams(temperature=1.0, seed=7, max_new_tokens=18, ignore_eos=True)
    for name, pipe in pipes.items():
        alone = [pipe.engine.generate(p, GREEDY).tokens for p in PROMPTS[:2]]
        batch = pipe.batch_engine(policy, max_batch=4)
        mine = [submit(batch, p, GREEDY) for p in PROMPTS[:2]]
        others = [submit(batch, PROMPTS[2], sampled, pipes["draft-tree"].with_speculative(pipes["draft-tree"].speculative).engine),
                  submit(batch, PROMPTS[3], SamplingParams(max_new_tokens=7), pipes["prompt-lookup"].engine)]
        batch.run()
        assert [c.tokens for c in mine] == alone, name
        assert all(c.result is not None and c.error is None for c in mine + others)
        assert len(others[1].tokens) <= 7


def test_requests_leave_without_disturbing_the_others(pipes):
    pipe = pipes["parallel-head"]
    alone = pipe.engine.generate(PROMPTS[0], GREEDY).tokens
    batch = pipe.batch_engine(BatchAwareBudget(cost=lambda n: 1.0 + 0.05 * n), max_batch=3)
    kept = submit(batch, PROMPTS[0], GREEDY)
    short = submit(batch, PROMPTS[1], SamplingParams(max_new_tokens=3))
    too_long = submit(batch, [5] * (pipe.engine.context_window + 4), GREEDY)  # fails when admitted
    cancelled = Collector()
    request = batch.submit(PROMPTS[2], GREEDY, cancelled.chunk, cancelled.fail)
    later = submit(batch, PROMPTS[3], GREEDY)  # waits for a free slot, then joins
    for _ in range(3):
        batch.step()
    request.cancel()
    batch.run()
    assert kept.tokens == alone
    assert short.result.stats.finish_reason == "length" and len(short.tokens) == 3
    assert isinstance(too_long.error, ForetellError) and "context window" in str(too_long.error)
    assert cancelled.result is None and 0 < len(cancelled.tokens) < 30
    assert later.tokens == pipe.engine.generate(PROMPTS[3], GREEDY).tokens
    assert batch.idle


def test_a_request_that_left_frees_its_caches_even_inside_a_reference_cycle(pipes):
    """A server keeps each request where its own callback reaches it (to cancel it): a cycle. Leaving the batch
    must still free the KV caches then, not at Python's next full collection."""
    import gc
    import weakref

    class Holder:  # holds the request; the request's callbacks hold it
        pass

    pipe = pipes["parallel-head"]
    batch = pipe.batch_engine(max_batch=2)
    holders = [Holder(), Holder()]
    for holder, params in zip(holders, [GREEDY, SamplingParams(max_new_tokens=60, ignore_eos=True)]):
        collector = Collector()
        holder.collector = collector
        holder.request = batch.submit(PROMPTS[0], params, lambda c, h=holder: h.collector.chunk(c),
                                      lambda e, h=holder: h.collector.fail(e))
    gc.disable()
    try:
        batch.step()
        caches = [weakref.ref(h.request.state.cache) for h in holders]
        holders[1].request.cancel()  # one leaves cancelled, the other finished
        batch.run()
        assert [c() for c in caches] == [None, None], "a request out of the batch still holds its KV cache"
    finally:
        gc.enable()
    assert holders[0].request.finished and holders[0].collector.result is not None
    assert not holders[1].request.finished and holders[1].collector.result is None


def test_a_long_prompt_is_read_in_chunks_while_others_decode(pipes):
    pipe = pipes["none"]
    batch = pipe.batch_engine(max_batch=2, prefill_chunk=4)
    running = submit(batch, PROMPTS[0], GREEDY)
    batch.step()  # its prompt
    batch.step()
    produced = len(running.tokens)
    long_prompt = (PROMPTS[1] * 4)[:25]
    newcomer = submit(batch, long_prompt, GREEDY)
    for _ in range(3):  # 24 prompt tokens to read, 4 a pass: the runner gains a token every pass meanwhile
        batch.step()
        assert newcomer.tokens == []
    assert len(running.tokens) == produced + 3
    batch.run()
    assert newcomer.tokens == pipe.engine.generate(long_prompt, GREEDY).tokens


def test_a_prompt_that_starts_with_a_kept_prefix_reads_only_the_rest(pipes):
    """Greedy fp32, every drafter: a conversation's next turn (the first prompt, its answer and a new message), a
    prompt sharing part of the first one, the first prompt again and a one-token prompt decode as they do alone,
    while their usage says the prefix cache gave them the rows they share (the prompt's last token is always read:
    it is the first decoding pass's input)."""
    first = (PROMPTS[2] * 4)[:37]
    for name, pipe in pipes.items():
        cache = PrefixCache(1 << 24, min_tokens=8)
        batch = pipe.batch_engine(max_batch=2, prefix_cache=cache)

        def turn(prompt):
            c = submit(batch, prompt, GREEDY)
            batch.run()
            assert c.tokens == pipe.engine.generate(prompt, GREEDY).tokens, name
            return c.tokens, c.result.stats.cached_prompt_tokens

        answer, cached = turn(first)
        assert cached == 0
        follow, sibling = first + answer + [14, 15, 5, 9], first[:25] + [3, 4, 6, 8]
        answers = {}
        for prompt, reused in ((follow, len(first) + len(answer) - 1), (sibling, 25), (first, 36), (PROMPTS[3], 0)):
            answers[len(prompt)], cached = turn(prompt)
            assert cached == reused, name
        # each finished request kept its prompt and answer; an entry another extends or covers was not kept apart
        kept = [len(follow) + len(answers[len(follow)]), len(sibling) + len(answers[len(sibling)]), 1 + len(answers[1])]
        assert sorted(len(key) + 1 for key in cache.entries) == sorted(kept), name


def test_a_pipelines_calls_share_its_prefix_cache(pipes):
    """pipe.with_prefix_cache: a call repeating an earlier prompt (the EAGLE-3 head drafting, single-stream engine)
    reads only its last token and decodes as without the cache; a pipeline without one reads it all."""
    text = " ".join(f"w{i % 40 + 3}" for i in range(0, 120, 7))
    pipe = pipes["eagle3"]
    cached = pipe.with_prefix_cache(16)
    params = dict(chat=False, max_new_tokens=20, ignore_eos=True)
    runs = [cached.generate(text, **params), cached.generate(text, **params), pipe.generate(text, **params)]
    assert runs[0].tokens == runs[1].tokens == runs[2].tokens
    prompt_len = len(pipe.encode(text, chat=False))
    assert [r.stats.cached_prompt_tokens for r in runs] == [0, prompt_len - 1, 0]
    assert pipe.prefix_cache is None and cached.with_prefix_cache(0).prefix_cache is None


def test_a_prefix_kept_without_the_drafters_rows_is_not_reused_by_it(pipes):
    """A plain request keeps no hook rows; a request whose drafter reads them reads its prompt itself (and still
    decodes as alone), and then keeps a prefix that serves both."""
    prompt = (PROMPTS[0] * 5)[:30]
    cache = PrefixCache(1 << 24, min_tokens=8)
    eagle = pipes["eagle3"]
    batch = eagle.batch_engine(max_batch=2, prefix_cache=cache)
    runs = []
    for engine in (pipes["none"].engine, None, None, pipes["none"].engine):
        runs.append(submit(batch, prompt, GREEDY, engine))
        batch.run()
    assert [c.result.stats.cached_prompt_tokens for c in runs] == [0, 0, 29, 29]
    assert runs[1].tokens == runs[2].tokens == eagle.engine.generate(prompt, GREEDY).tokens
    assert runs[0].tokens == runs[3].tokens == pipes["none"].engine.generate(prompt, GREEDY).tokens


def test_requests_sharing_a_prompt_in_one_batch_read_it_once(pipes):
    """Greedy fp32: a prompt sent three times at once (a request's n choices) with one other prompt: the first reads
    the shared prompt, the other two wait for its rows and read only its last token, and each decodes as alone;
    the other prompt does not wait. Choices of a prompt whose start is kept take that start, and two then wait for
    the rest. A request whose drafter reads hook rows does not wait for one that keeps none
    (plain), while a plain one waits for the drafter's (its rows serve both)."""
    prompt = (PROMPTS[2] * 5)[:40]
    other = (PROMPTS[0] * 6)[:30]
    for name in ("none", "eagle3", "prompt-lookup", "hidden-state"):
        pipe = pipes[name]
        cache = PrefixCache(1 << 24, min_tokens=8)
        batch = pipe.batch_engine(max_batch=4, prefill_chunk=16, prefix_cache=cache)
        runs = [submit(batch, prompt, GREEDY) for _ in range(3)] + [submit(batch, other, GREEDY)]
        batch.run()
        assert [c.result.stats.cached_prompt_tokens for c in runs] == [0, 39, 39, 0], name
        alone = pipe.engine.generate(prompt, GREEDY).tokens
        assert [c.tokens for c in runs] == [alone] * 3 + [pipe.engine.generate(other, GREEDY).tokens], name
        # a prompt starting with a kept one (a system prompt): all three start from its rows, two then wait
        longer = prompt[:30] + other[1:]
        runs = [submit(batch, longer, GREEDY) for _ in range(3)]
        batch.run()
        assert [c.result.stats.cached_prompt_tokens for c in runs] == [30] + [len(longer) - 1] * 2, name
        assert [c.tokens for c in runs] == [pipe.engine.generate(longer, GREEDY).tokens] * 3, name
    eagle, plain = pipes["eagle3"], pipes["none"].engine
    for engines, cached in (((plain, None), [0, 0]), ((None, plain), [0, 39])):
        batch = eagle.batch_engine(max_batch=2, prefill_chunk=16, prefix_cache=PrefixCache(1 << 24, min_tokens=8))
        runs = [submit(batch, prompt, GREEDY, engine) for engine in engines]
        batch.run()
        assert [c.result.stats.cached_prompt_tokens for c in runs] == cached
        assert [c.tokens for c in runs] == [(engine or eagle.engine).generate(prompt, GREEDY).tokens
                                            for engine in engines]


def test_requests_do_not_wait_for_a_prompt_too_large_to_keep(pipes):
    """The waiting above only where the first one's rows can be kept: with a prefix cache smaller than the prompt's
    rows, three requests for one prompt all start reading it in the first pass (with room, all waited for one)."""
    pipe = pipes["none"]
    prompt = (PROMPTS[2] * 5)[:40]
    row_bytes = 2 * pipe.target.model.new_cache(8).k[:, :, :, :1].numel() * 4  # float32 keys and values
    for size, reading in ((1 << 24, [True, False, False]), (20 * row_bytes, [True, True, True])):
        batch = pipe.batch_engine(max_batch=3, prefill_chunk=256, prefix_cache=PrefixCache(size, min_tokens=8))
        runs = [submit(batch, prompt, GREEDY) for _ in range(3)]
        batch.step()  # admits all three; the first pass reads prompts
        assert [r.state.prefilled > 0 for r in batch.active] == reading
        batch.run()
        assert [c.tokens for c in runs] == [pipe.engine.generate(prompt, GREEDY).tokens] * 3


def test_a_drafter_gated_off_in_a_batch_still_offers_its_result_cache_branch(pipes):
    """A batch's pre-draft 0 stops the drafter's forwards, not the result cache's branch, which costs none: the
    branch is proposed for the budget to weigh (its nodes valued by the branch's measured acceptance), and the pass
    does not count as a drafted one (its time would make the drafter's levels look free)."""
    pipe = pipes["parallel-head"]  # result_cache="prompt"
    prompt = (PROMPTS[2] * 4)[:37]  # repeats itself: the prompt's n-grams match
    state = pipe.engine.start(prompt, GREEDY)
    step = state.prefill_pass()
    state.prefilled_pass(step, pipe.target.model(step.input_ids, step.positions, step.cache,
                                                  hidden_layers=step.hidden_layers, logits_rows=step.logits_rows))
    steps = state.draft_steps(0)
    with pytest.raises(StopIteration) as done:  # no drafter forward to wait on
        next(steps)
    proposal = done.value.value
    assert proposal.size > 0 and not state.drafter_ran
    assert sorted(state.branch_steps()) == list(range(proposal.size))


def test_concurrent_requests_each_fill_their_own_result_cache_sequence(pipes):
    """Requests decoded in one batch commit in turns. Where their engines share one result cache, each request's
    tokens go into its own sequence: every stored sequence is one request's prompt followed by exactly that
    request's output (before, every commit landed in the newest request's sequence)."""
    pipe = pipes["parallel-head"]
    shared = ResultCache(include_prompt=True)
    batch = pipe.batch_engine(max_batch=3)
    prompts = [PROMPTS[0], PROMPTS[1], (PROMPTS[2] * 3)[:30]]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (12, 20, 16)]
    runs = [submit(batch, prompt, p, replace(pipe.with_speculative(pipe.speculative).engine, result_cache=shared))
            for prompt, p in zip(prompts, params)]
    batch.run()
    assert [r.tokens for r in runs] == [pipe.engine.generate(*a).tokens for a in zip(prompts, params)]  # lossless
    assert shared.sequences() == [list(p) + r.tokens for p, r in zip(prompts, runs)]


def test_the_prefix_cache_keeps_what_fits_least_recently_used_first_out(tiny_pair):
    pipe = load(tiny_pair[0], "none", warm_up=False)
    prompts = [[1] + [10 + i] * 20 for i in range(4)]
    one_token = SamplingParams(max_new_tokens=1)  # kept at the end: the prompt's 21 rows (its last one now read)
    one = pipe.target.model.new_cache(32)
    per_entry = 2 * one.k[:, :, :, :21].numel() * one.k.element_size()
    cache = PrefixCache(3 * per_entry, min_tokens=8)
    batch = pipe.batch_engine(max_batch=1, prefix_cache=cache)
    for prompt in prompts[:3] + prompts[:1]:  # the first is used again: the second is now the oldest
        submit(batch, prompt, one_token)
        batch.run()
    assert cache.nbytes == 3 * per_entry
    submit(batch, prompts[3], one_token)
    batch.run()
    assert [key[1] for key in cache.entries] == [12, 10, 13] and cache.nbytes == 3 * per_entry
    assert cache.stats.queries == 5 and cache.stats.hits == 1 and cache.stats.reused_tokens == 20
    small = PrefixCache(per_entry // 2, min_tokens=8)  # no room for one prompt: nothing kept, nothing breaks
    tight = pipe.batch_engine(max_batch=1, prefix_cache=small)
    answer = submit(tight, prompts[0], one_token)
    tight.run()
    assert answer.result is not None and not small.entries and small.nbytes == 0
    with pytest.raises(ForetellError, match="max_bytes"):
        PrefixCache(-1)


def test_sampling_in_a_batch_follows_the_target(micro):
    """Temperature 1, draft-model chains, four requests per batch: each request's tokens follow the target's
    exact distribution (the statistical test of test_engine_statistical)."""
    from test_engine_statistical import GAMMA, NEW, PROMPT, RUNS, VOCAB, exact_marginals, worst_p_value

    target, root = micro
    pipe = load(root / "t", SpeculativeConfig(method="draft-model", model=str(root / "d"), gamma=GAMMA,
                                              draft_quant="none"), warm_up=False)
    batch = pipe.batch_engine(BatchAwareBudget(cost=lambda n: 1.0 + 0.1 * n), max_batch=4)
    collectors = [submit(batch, PROMPT, SamplingParams(temperature=1.0, seed=seed, max_new_tokens=NEW, ignore_eos=True))
                  for seed in range(RUNS)]
    batch.run()
    counts = torch.zeros(NEW, VOCAB)
    for c in collectors:
        assert len(c.tokens) == NEW
        counts[torch.arange(NEW), torch.tensor(c.tokens)] += 1
    assert worst_p_value(counts, exact_marginals(target, SamplingParams(temperature=1.0))) > 1e-3 / NEW


# --- budget policies ---------------------------------------------------------------------------


def test_node_values():
    chain = Proposal(tokens=torch.tensor([4, 5, 6]))
    assert node_values(chain, [0.5, 0.4], 1.0) == pytest.approx([0.5, 0.2, 0.08])  # past the history: the last rate
    tree = Proposal(tokens=torch.tensor([1, 2, 3]), parents=torch.tensor([-1, 0, -1]),
                    draft_prob=torch.tensor([0.8, 0.5, 0.1]))
    assert node_values(tree, [], 0.5) == pytest.approx([0.4, 0.1, 0.05])
    assert node_values(tree, [], 5.0) == pytest.approx([1.0, 1.0, 0.5])  # capped at 1 per step
    # a result-cache branch below node 0 (draft_prob 0: the drafter never vouched for it) at its measured acceptance
    merged = Proposal(tokens=torch.tensor([1, 2, 7, 8]), parents=torch.tensor([-1, 0, 0, 2]),
                      draft_prob=torch.tensor([0.8, 0.5, 0.0, 0.0]))
    assert node_values(merged, [], 1.0) == pytest.approx([0.8, 0.4, 0.0, 0.0])
    assert node_values(merged, [], 1.0, {2: 0.6, 3: 0.6}) == pytest.approx([0.8, 0.4, 0.48, 0.288])


def test_batch_aware_budget_keeps_drafts_while_they_pay():
    values = [[0.9, 0.8, 0.2], [0.5, 0.1], []]
    cheap = BatchAwareBudget(cost=lambda n: 1.0 + 0.01 * n)
    assert cheap.caps(values) == [3, 2, 0]
    dear = BatchAwareBudget(cost=lambda n: float(n))  # a token costs as much as a pass: nothing pays
    assert dear.caps(values) == [0, 0, 0]
    middle = BatchAwareBudget(cost=lambda n: 1.0 + 0.3 * n)
    caps = middle.caps(values)
    assert caps[0] >= 1 and caps[1] <= caps[0] and sum(caps) < 5  # the best nodes first, the weak ones dropped


def test_batch_aware_budget_looks_past_a_step_in_the_cost_curve():
    # One more token moves the pass onto a dearer step (1.0 -> 1.6 s) and does not pay alone; four do.
    stepped = BatchAwareBudget(cost=lambda n: 1.0 if n <= 1 else 1.6)
    assert stepped.caps([[0.5, 0.5, 0.5, 0.5]]) == [4]
    assert stepped.caps([[0.5, 0.05]]) == [0]  # 1.55 tokens in 1.6 s is worse than 1 in 1 s


def test_before_drafting_a_dear_drafter_is_not_run():
    """The pre-draft rule: the same expected acceptance pays from a cheap drafter and not from a dear one."""
    budget = BatchAwareBudget(cost=lambda n: 1.0 + 0.01 * n)
    values = [chain_values([0.8, 0.6], 4), chain_values([0.8, 0.6], 4)]
    assert values[0] == pytest.approx([0.8, 0.48, 0.288, 0.1728])
    assert budget.caps(values, [0.01, 0.01]) == [4, 4]
    assert budget.caps(values, [0.01, 5.0]) == [4, 0]  # a level of the second drafter costs five passes
    caps = budget.caps(values, [0.3, 0.3])  # the deep levels no longer pay for their drafting
    assert 0 < caps[0] < 4 and 0 < caps[1] < 4
    assert chain_values([], 2) == [0.5, 0.25] and chain_values([0.9], 0) == []


def test_the_batch_budget_learns_what_each_request_adds_to_a_pass():
    budget = BatchAwareBudget(cost=lambda n: 0.01 * n, smoothing=0.5)
    for _ in range(30):
        budget.observe(tokens=4, requests=2, seconds=0.05)  # 0.04 s by the curve, 0.005 s more a request
    assert budget.per_request == pytest.approx(0.005)
    budget.observe(tokens=4, requests=2, seconds=0.01)  # faster than the curve: no negative cost
    assert 0.0 <= budget.per_request < 0.005


def test_requests_whose_drafts_would_not_pay_are_not_drafted(pipes):
    """With the batch-aware budget and more than one request, a drafter whose level costs more than its drafts
    return is not run at all; the tokens stay each request's tokens alone."""
    pipe = pipes["draft-model"]
    alone = [pipe.engine.generate(p, GREEDY).tokens for p in PROMPTS[:2]]
    name = pipe.engine.drafter.name
    for seconds_a_level, drafted in [(100.0, False), (0.0, True)]:
        batch = pipe.batch_engine(BatchAwareBudget(cost=lambda n: 1.0 + 0.001 * n), max_batch=4)
        batch.draft_seconds.per_level[name] = seconds_a_level
        batch.draft_seconds.smoothing = 0.0  # keep the figure set here
        mine = [submit(batch, p, GREEDY) for p in PROMPTS[:2]]
        batch.run()
        assert [c.tokens for c in mine] == alone
        verified = sum(c.result.stats.draft_tokens_verified for c in mine)
        assert (verified > 0) == drafted, (seconds_a_level, verified)


def test_fixed_by_batch_size():
    rule = FixedByBatchSize(limits=(1, 4), lengths=(6, 2))
    assert rule.caps([[0.5] * 8]) == [6]
    assert rule.caps([[0.5] * 8, [0.5], [], [0.5] * 3]) == [2, 1, 0, 2]
    assert rule.caps([[0.5] * 8] * 5) == [0] * 5


def test_the_fixed_rule_drafts_no_deeper_than_its_length(pipes):
    """Under FixedByBatchSize a request drafts only as deep as the rule's length for the batch (a drafter's tree
    past it would be cut before verification): with length 1, every drafted proposal is one level deep, and the
    output is still each request's own."""
    pipe = pipes["eagle3"]
    alone = [pipe.engine.generate(p, GREEDY).tokens for p in PROMPTS[:2]]
    batch = pipe.batch_engine(FixedByBatchSize(limits=(4,), lengths=(1,)), max_batch=2)
    depths = []
    draft_all = batch._draft_all

    def recording(ready, limits):
        proposals = draft_all(ready, limits)
        depths.extend(p.depth for p in proposals if p.size)
        return proposals

    batch._draft_all = recording
    mine = [submit(batch, p, GREEDY) for p in PROMPTS[:2]]
    batch.run()
    assert [c.tokens for c in mine] == alone
    assert depths and set(depths) == {1}
    assert FixedByBatchSize(limits=(1, 4), lengths=(6, 2)).length(3) == 2


def test_truncate_keeps_a_valid_tree():
    tree = Proposal(tokens=torch.tensor([1, 2, 3, 4]), parents=torch.tensor([-1, 0, -1, 1]),
                    draft_prob=torch.tensor([0.5, 0.5, 0.5, 0.5]))
    cut = truncate(tree, 2)
    assert cut.tokens.tolist() == [1, 2] and cut.parents.tolist() == [-1, 0] and cut.draft_prob.numel() == 2
    assert truncate(tree, 9) is tree


def test_packed_rows_bucket_the_batch_shapes():
    """The packed pass pads to few row counts (the runtime keeps kernels per shape) and never by more than 1/8."""
    from foretell.models.transformer import packed_rows

    buckets = {packed_rows(n) for n in range(1, 4097)}
    assert all(packed_rows(n) >= n and packed_rows(n) - n <= max(7, n // 8) for n in range(1, 4097))
    assert len(buckets) <= 8 * 12
    assert packed_rows(packed_rows(300)) == packed_rows(300)


def test_a_rejected_first_draft_does_not_end_a_requests_drafting():
    """Acceptance by depth is the request's own counts smoothed towards its drafter's pooled counts: one rejection
    lowers a request's estimate without zeroing it, and a drafter that keeps failing everywhere is valued low."""
    from foretell.sizing.batch import DepthAcceptance

    good = DepthAcceptance()
    good.add([60, 30], [100, 60])
    after_one_rejection = good.rates([0], [1])
    assert 0.3 < after_one_rejection[0] < 0.6 and after_one_rejection[1] == pytest.approx((4 * 30.5 / 61) / 4)
    assert good.rates([0] * 1, [40])[0] < 0.1  # its own long record of failure outweighs the pool
    bad = DepthAcceptance()
    bad.add([1], [100])
    assert bad.rates([], [])[0] < 0.05
    assert DepthAcceptance().rates([], []) == []
    merged = DepthAcceptance().merged([([1, 0], [2, 1]), ([3], [4])])
    assert merged.accepted == [4, 0] and merged.proposed == [6, 1]
