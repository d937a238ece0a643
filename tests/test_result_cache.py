"""The result cache (result_cache.py): n-gram index over committed outputs, its branch merged
into tree proposals within the node budget, lossless greedy and sampled, hit rates reported."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from conftest import PROMPTS, greedy_params
from foretell.api import load
from foretell.config import HeadTreeShape, SpeculativeConfig
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.parallel_tree import ParallelHeadDrafter
from foretell.errors import ForetellError
from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head
from foretell.result_cache import ResultCache, merge_branch
from foretell.sampling import processed_probs, sample
from foretell.types import Proposal, SamplingParams
from foretell.verify import verify_tree_sampled


def head_engine(plain, cache=True):
    target = plain.engine.target
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=3)
    engine = plain.with_drafter(ParallelHeadDrafter(head, HeadTreeShape(max_nodes=8))).engine
    return replace(engine, result_cache=ResultCache() if cache else None)


# --- the index ------------------------------------------------------------------------------


def test_lookup_finds_what_followed_in_this_and_earlier_requests():
    cache = ResultCache(max_ngram=3, min_ngram=2, max_branch=4)
    seq = cache.begin([1, 2])  # a prompt: indexed only where the output starts
    cache.extend(seq, [1, 2, 3, 4, 5, 6, 7])
    assert cache.lookup([9, 3, 4], 10) == [5, 6, 7]  # the 2-gram (3, 4)
    assert cache.lookup([9, 1, 2], 10) == [3, 4, 5, 6]  # keys may reach into the prompt; max_branch caps
    assert cache.lookup([9, 8, 7, 1], 10) == [] and cache.lookup([3], 10) == []  # no 1-gram keys
    seq = cache.begin([0])  # a later request sees the earlier one
    cache.extend(seq, [0, 3, 4, 9])
    assert cache.lookup([5, 3, 4], 2) == [9]  # the newest occurrence wins (its continuation is still short)
    assert cache.lookup([2, 3, 4], 2) == [5, 6]  # a longer matching n-gram first
    with pytest.raises(ForetellError, match="min_ngram"):
        ResultCache(min_ngram=3, max_ngram=2)


def test_include_prompt_indexes_the_prompt_from_the_first_step():
    """Prompt lookup inside the tree: a prompt n-gram's continuation is a branch before any output exists."""
    outputs_only, with_prompt = ResultCache(max_ngram=2), ResultCache(max_ngram=2, include_prompt=True)
    seqs = [cache.begin([1, 2, 3, 4, 5, 2, 3]) for cache in (outputs_only, with_prompt)]
    assert outputs_only.lookup([1, 2, 3, 4, 5, 2, 3], 8) == []
    assert with_prompt.lookup([1, 2, 3, 4, 5, 2, 3], 8) == [4, 5, 2, 3]  # what followed (2, 3) in the prompt
    with_prompt.extend(seqs[1], [1, 2, 3, 4, 5, 2, 3, 9])
    assert with_prompt.lookup([7, 3, 9], 8) == [] and with_prompt.lookup([7, 2, 3], 8) == [9]  # newest wins


def test_old_requests_are_dropped_past_the_token_limit():
    cache = ResultCache(max_tokens=6)
    seq = cache.begin([1, 2])
    cache.extend(seq, [1, 2, 3, 4])
    seq = cache.begin([5, 6])
    cache.extend(seq, [5, 6, 7, 8])  # 8 tokens stored: the first request goes at the next begin
    cache.begin([9])
    assert cache.lookup([0, 1, 2], 4) == [] and cache.lookup([0, 5, 6], 4) == [7, 8]



def test_interleaved_requests_each_write_into_their_own_sequence():
    """Requests decoded together (the batching server) commit in turns: each extend lands in its own request's
    sequence, and a request dropped meanwhile (token limit, clear) is ignored rather than written elsewhere."""
    cache = ResultCache(max_ngram=2)
    first, second = cache.begin([1, 2]), cache.begin([5, 6])
    cache.extend(first, [1, 2, 3])
    cache.extend(second, [5, 6, 7])
    cache.extend(first, [1, 2, 3, 4])
    assert cache.sequences() == [[1, 2, 3, 4], [5, 6, 7]]
    assert cache.lookup([0, 2, 3], 4) == [4] and cache.lookup([0, 5, 6], 4) == [7]
    cache.clear()
    cache.extend(first, [1, 2, 3, 4, 8])  # forgotten: nothing stored, nothing raised
    assert cache.sequences() == [] and cache.lookup([0, 3, 4], 4) == []
    with pytest.raises(ForetellError, match="no request 9 was begun"):
        cache.extend(9, [1])

# --- merging into a proposal ----------------------------------------------------------------


def test_merge_shares_prefixes_and_appends_after_the_drafters_nodes():
    tree = Proposal(torch.tensor([5, 6, 7]), parents=torch.tensor([-1, -1, 0]), draft_prob=torch.tensor([0.6, 0.3, 0.5]))
    merged = merge_branch(tree, [5, 8, 9], max_nodes=8)
    p = merged.proposal
    assert p.tokens.tolist() == [5, 6, 7, 8, 9] and p.parents.tolist() == [-1, -1, 0, 0, 3]
    assert merged.added == [3, 4] and p.draft_prob.tolist()[3:] == [0.0, 0.0]  # never waived by lossy mode
    assert merge_branch(tree, [5, 7], 8).proposal is tree  # nothing new
    chain = merge_branch(Proposal(torch.tensor([1, 2])), [1, 3], 8).proposal  # a chain becomes a tree
    assert chain.parents.tolist() == [-1, 0, 0] and chain.tokens.tolist() == [1, 2, 3]


def test_merge_respects_the_budget_by_evicting_the_least_likely_leaves():
    # Path values: n0 .6, n1 .3, n2 .3 (.6 * .5), n3 .06; a full budget of 4.
    tree = Proposal(torch.tensor([5, 6, 7, 8]), parents=torch.tensor([-1, -1, 0, 2]),
                    draft_prob=torch.tensor([0.6, 0.3, 0.5, 0.2]))
    merged = merge_branch(tree, [9, 10, 11], max_nodes=4)  # may take max(1, 4 // 4) = 1 node
    assert merged.proposal.size == 4 and merged.added == [3]
    assert merged.proposal.tokens.tolist() == [5, 6, 7, 9]  # n3 (0.06) went
    assert merged.proposal.parents.tolist() == [-1, -1, 0, -1]
    # Without draft probabilities the latest nodes go first; q rows stay aligned, the branch's are one-hot.
    q = torch.softmax(torch.randn(4, 12), -1)
    merged = merge_branch(Proposal(tree.tokens, q=q, parents=tree.parents), [5, 9], max_nodes=4)
    p = merged.proposal
    assert p.tokens.tolist() == [5, 6, 7, 9] and p.parents.tolist() == [-1, -1, 0, 0]
    assert torch.equal(p.q[:3], q[:3]) and p.q[3].tolist() == [0.0] * 9 + [1.0] + [0.0] * 2


def test_merged_tree_is_lossless_when_sampling():
    """Sampled children (SpecInfer, q rows) then a point-mass cache child under one parent: the first
    emitted token must follow the target's p. The same test rejects a wrongly merged tree (the cache
    node given the drafter's q row), so the sample is large enough to see a bias."""
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0)
    p_logits = torch.tensor([[1.5, 0.2, -0.5, 0.9, 0.0, -1.0]] * 4)
    q = torch.softmax(torch.tensor([0.1, 1.8, 0.3, -0.4, 1.0, 0.2]), -1)
    p = processed_probs(p_logits[0], params)

    def counts(wrong: bool, n=8000):
        out = torch.zeros(6)
        for _ in range(n):
            a, b = sample(q, g), sample(q, g)  # two i.i.d. sampled siblings (maybe equal)
            drafted = Proposal(torch.tensor([a, b]), q=torch.stack([q, q]), parents=torch.tensor([-1, -1]))
            merged = merge_branch(drafted, [3], max_nodes=8).proposal  # the cache's token 3, unless drafted
            if wrong and merged.size == 3:
                merged = replace(merged, q=torch.stack([q, q, q]))
            v = verify_tree_sampled(p_logits[: merged.size + 1], merged, params, g)
            out[merged.tokens[v.path[0]] if v.path else v.next_token] += 1
        return out

    def p_value(c):
        expected = p.double() / p.double().sum() * c.sum()
        return chisquare(c.double().numpy(), expected.numpy()).pvalue

    assert p_value(counts(wrong=False)) > 1e-3
    assert p_value(counts(wrong=True)) < 1e-3


# --- through the engine ---------------------------------------------------------------------


def test_greedy_equals_plain_and_hits_on_repeated_requests(plain):
    engine = head_engine(plain)
    for prompt in PROMPTS:
        want = plain.engine.generate(prompt, greedy_params()).tokens
        first = engine.generate(prompt, greedy_params())
        again = engine.generate(prompt, greedy_params())  # verified work of the first request, reused
        assert first.tokens == want and again.tokens == want
        s = again.stats
        assert s.cache_hits > 0 and s.cache_useful > 0 and s.cache_accepted_tokens > 0
        assert s.tau > first.stats.tau
        assert 0 < s.cache_useful_rate <= s.cache_hit_rate <= 1
        d = s.to_dict()
        assert d["cache_hit_rate"] == round(s.cache_hit_rate, 4) and "result cache hits" in s.summary()
    assert "cache_hit_rate" not in head_engine(plain, cache=False).generate(PROMPTS[0], greedy_params()).stats.to_dict()


def test_draft_gate_skipping_the_head_keeps_greedy_exact(plain):
    """The parallel head with the scheduler and the draft gate (exploring every 2nd decision): passes
    without the head leave it features of several steps to catch up on; the output stays plain greedy's."""
    from test_tree_scheduler import curve

    from foretell.sizing.gate import DraftGate
    from foretell.sizing.tree import AdaptiveTreeScheduler

    target = plain.engine.target
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=3)
    drafter = ParallelHeadDrafter(head, HeadTreeShape(max_nodes=8), AdaptiveTreeScheduler(curve(0.001)))
    gate = DraftGate(explore_every=2)
    engine = replace(plain.with_drafter(drafter).engine, draft_gate=gate, result_cache=ResultCache(include_prompt=True))
    for prompt in [*PROMPTS, [1, 5, 9, 12, 5, 9, 30, 5, 9, 12, 5, 9]]:
        assert engine.generate(prompt, greedy_params()).tokens == plain.engine.generate(prompt, greedy_params()).tokens
    assert 0 < gate.skipped < gate.decisions


def test_draft_tree_with_cache_through_load(tiny_pair, plain):
    for kind, params in (("dynamic", greedy_params(24)),
                         ("static", SamplingParams(temperature=1.0, seed=2, max_new_tokens=24, ignore_eos=True))):
        from foretell.config import TreeShape

        children = "sampled" if kind == "static" else "topk"
        pipe = load(tiny_pair[0], SpeculativeConfig(method="draft-tree", model=str(tiny_pair[1]), tree=TreeShape(kind=kind, children=children), result_cache="outputs", draft_quant="none"), dtype="float32", warm_up=False)
        for prompt in PROMPTS[:3]:
            result = pipe.engine.generate(prompt, params)
            assert len(result.tokens) == 24 and result.stats.cache_steps > 0
            if params.greedy:
                assert result.tokens == plain.engine.generate(prompt, params).tokens


def test_prompt_lookup_branch_keeps_greedy_exact_and_hits_on_a_first_request(plain):
    engine = replace(head_engine(plain, cache=False), result_cache=ResultCache(include_prompt=True))
    prompt = [1, 5, 9, 12, 5, 9, 30, 5, 9, 12, 5, 9]
    want = plain.engine.generate(prompt, greedy_params()).tokens
    result = engine.generate(prompt, greedy_params())
    assert result.tokens == want and result.stats.cache_hits > 0


def test_bench_variants_are_configuration_changes():
    """M-lookup, M-cache, M-gate, M-fp, M-lossy-T and M@N change one option of M's configuration; a variant
    whose option does not apply to M is refused by the configuration, before anything loads."""
    from foretell.bench.methods import MethodOptions, Models, variant_spec

    models = Models("target", draft="draft", head="head", hidden_draft="hidden", draft_quant="int8")
    spec = lambda name: variant_spec(name).spec(models, MethodOptions())  # noqa: E731
    assert spec("parallel-head-auto-lookup") == replace(spec("parallel-head-auto"), result_cache="prompt")
    assert spec("draft-tree-cache") == replace(spec("draft-tree"), result_cache="outputs")
    assert spec("parallel-head-auto-lookup-gate") == replace(spec("parallel-head-auto"), result_cache="prompt",
                                                             draft_gate=True)
    assert spec("hidden-state-auto-fp").draft_quant == "none" and spec("hidden-state-auto").draft_quant == "int8"
    assert spec("draft-chain-lossy-0.9").lossy_threshold == 0.9
    both = spec("hidden-state-lookup@8")
    assert both.hidden.max_nodes == 8 and both.result_cache == "prompt" and both.method == "hidden-state"
    assert spec("draft-tree@16").tree.total_tokens == 16
    assert variant_spec("parallel-head-auto-x") is None and variant_spec("nothing-lookup") is None
    with pytest.raises(ForetellError, match="result_cache .* not draft-model"):
        spec("draft-chain-lookup")
    with pytest.raises(ForetellError, match="hidden.max_nodes fixes"):
        spec("hidden-state-auto@8")


def head_folder(plain, folder: Path) -> str:
    from foretell.models.parallel_head import save_parallel_head

    target = plain.engine.target
    save_parallel_head(new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=3), folder)
    return str(folder)


def test_bench_gate_variants(plain, tmp_path):
    """M-gate: M with the draft gate, the same drafter weights."""
    from test_tree_scheduler import curve

    from foretell.bench.methods import MethodOptions, Models, build_methods

    models = Models(target="unused", head=head_folder(plain, tmp_path / "head"))
    models._pipe = plain
    plain.weights._loaded["cost", "target"] = curve(0.001)  # no measuring on the test machine
    ungated, gated = build_methods(["parallel-head-auto", "parallel-head-auto-gate"], models, MethodOptions())
    assert gated.pipe.engine.draft_gate is not None and ungated.pipe.engine.draft_gate is None
    assert gated.name == "parallel-head-auto-gate"
    assert gated.pipe.engine.drafter.head is ungated.pipe.engine.drafter.head  # loaded once


def test_cache_needs_a_tree_drafter(tiny_pair, plain):
    with pytest.raises(ForetellError, match="result_cache .* applies to the draft-tree, parallel-head, hidden-state"):
        load(tiny_pair[0], SpeculativeConfig(method="prompt-lookup", result_cache="outputs"), warm_up=False)
    chain = DraftModelDrafter(plain.engine.target, plain.engine.target.config.vocab_size)
    with pytest.raises(ForetellError, match="needs a tree drafter .* not draft-model"):
        replace(plain.with_drafter(chain).engine, result_cache=ResultCache())


def test_clear_forgets_stored_requests():
    cache = ResultCache(max_ngram=2)
    seq = cache.begin([1, 2])
    cache.extend(seq, [1, 2, 3, 4, 5])
    assert cache.lookup([9, 3, 4], 4) == [5]
    cache.clear()
    assert cache.lookup([9, 3, 4], 4) == []
    seq = cache.begin([7, 3])
    cache.extend(seq, [7, 3, 4, 6])
    assert cache.lookup([9, 3, 4], 4) == [6]


def test_bench_warm_up_leaves_nothing_for_the_timed_run(plain, tmp_path):
    """The bench's untimed warm-up run of a method must not feed the result cache of the timed run."""
    from foretell.bench.methods import ForetellMethod, MethodOptions
    from foretell.bench.runner import RunConfig, warm_up

    spec = SpeculativeConfig(method="parallel-head", model=head_folder(plain, tmp_path / "head"),
                             head_tree=HeadTreeShape(max_nodes=8), result_cache="outputs")
    method = ForetellMethod("parallel-head-cache", plain, spec, MethodOptions())
    ids = PROMPTS[0]
    counts = lambda stats: {k: v for k, v in stats.items() if not k.endswith("_seconds")}  # noqa: E731 (not timings)
    fresh = method.run(ids, 24)[1]
    method.reset()
    warm_up([method], lambda _: ids, RunConfig(Path("unused"), warmup_tokens=24, max_new_tokens=24))
    assert counts(method.run(ids, 24)[1]) == counts(fresh)  # without the reset it hits the first run's output
    assert method.run(ids, 24)[1]["cache_useful"] > fresh["cache_useful"]


# --- the branch sizer: how much of the branch a scheduled pass verifies ----------------------------


def test_branch_sizer_keeps_the_branch_where_rows_are_cheap_and_trims_it_where_they_are_not():
    from foretell.sizing.branch import BranchSizer

    sizer = BranchSizer()
    flat = lambda tokens: 0.010 + 1e-6 * tokens  # noqa: E731 - a pass costs about the same at any width
    steep = lambda tokens: 0.010 * tokens  # noqa: E731 - each row costs a whole one-token pass
    assert sizer.size(8, 4, 2.0, flat, 0.002) == 8
    assert sizer.size(8, 4, 3.0, steep, 0.002) == 0  # a row now yields less than the tree's rows did
    for _ in range(30):  # the branch has been accepted whole, pass after pass
        sizer.record(8, 8)
    assert sizer.acceptance > 0.95
    middling = lambda tokens: 0.010 + 0.002 * tokens  # noqa: E731
    trusted = sizer.size(8, 4, 2.0, middling, 0.002)
    doubted = BranchSizer()
    for _ in range(30):  # rejected at its first token every time
        doubted.record(8, 0)
    assert doubted.acceptance < 0.1
    assert doubted.size(8, 4, 2.0, middling, 0.002) < trusted


def test_a_trimmed_branch_keeps_scheduled_decoding_exact(plain):
    """A steep cost curve trims the branch (and the tree) of a scheduled head: still plain greedy's tokens."""
    from conftest import PROMPTS, greedy_params
    from foretell.sizing.cost import CostCurve
    from foretell.drafters.parallel_tree import ParallelHeadDrafter
    from foretell.sizing.tree import AdaptiveTreeScheduler, ScheduleLimits
    from dataclasses import replace

    from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head
    from foretell.result_cache import ResultCache

    target = plain.target.model
    sizes = [1, 2, 4, 8, 16, 32, 64]
    steep = CostCurve(sizes, [0.01 * n for n in sizes], context=256)
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, depth=3))
    scheduler = AdaptiveTreeScheduler(steep, ScheduleLimits(max_nodes=12, probe_every=4))
    cache = ResultCache(include_prompt=True)
    engine = replace(plain.with_drafter(ParallelHeadDrafter(head, scheduler=scheduler)).engine, result_cache=cache)
    for prompt in PROMPTS:
        assert engine.generate(prompt, greedy_params()).tokens == plain.engine.generate(prompt, greedy_params()).tokens
    assert cache.sizer._accepted + cache.sizer._stopped > 0  # branches were verified and measured
