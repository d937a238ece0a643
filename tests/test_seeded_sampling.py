"""Seeded sampling under the coupled rule (coupled.py): the output is a function of the seed and the prompt.

Speculative decoding returns plain seeded decoding's very tokens for every drafter, tree, fixed and auto budget,
alone and in a batch of 4, greedy and sampled (fp32); drafters draft with the verifier's noise at the right
positions; the noise and the Gumbel-max token are exact. That the coupled rule samples the target's distribution
is tested statistically in test_verify_statistical.py and test_engine_statistical.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import PROMPTS
from foretell.api import load
from foretell.config import SpeculativeConfig, TreeShape
from foretell.coupled import GUMBEL_MAX, Coupling, GumbelNoise, coupled_token, verify_coupled
from foretell.errors import ForetellError
from foretell.models.eagle3 import new_eagle3_head, save_eagle3_head
from foretell.models.hidden_draft import new_hidden_draft, save_hidden_draft
from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head, save_parallel_head
from foretell.sizing.batch import BatchAwareBudget, FixedByBatchSize
from foretell.types import Proposal, SamplingParams
from test_batching import submit

GREEDY = SamplingParams(max_new_tokens=30, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=11, max_new_tokens=30, ignore_eos=True)
PARAMS = {"greedy": GREEDY, "sampled": SAMPLED}


@pytest.fixture(scope="module")
def plain(tiny_pair, tmp_path_factory):
    return load(tiny_pair[0], "none", warm_up=False, cache_dir=tmp_path_factory.mktemp("cost"))


@pytest.fixture(scope="module")
def pipes(plain, tiny_pair, tmp_path_factory):
    """Every drafter over the tiny fp32 target (weights shared), trees, and the auto budget where it applies."""
    target = plain.target.model
    folder = tmp_path_factory.mktemp("seeded")
    head = save_parallel_head(new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=3),
                              folder / "head")
    hidden = save_hidden_draft(new_hidden_draft(target, seed=3), folder / "hidden")
    eagle = save_eagle3_head(new_eagle3_head(target, seed=3), folder / "eagle3")
    draft = dict(model=str(tiny_pair[1]), draft_quant="none")
    specs = {
        "none": SpeculativeConfig(method="none"),
        "prompt-lookup": SpeculativeConfig(gamma=3),
        "draft-model": SpeculativeConfig(method="draft-model", gamma=3, **draft),
        "draft-tree": SpeculativeConfig(method="draft-tree", **draft),
        "draft-tree-static-sampled": SpeculativeConfig(
            method="draft-tree", tree=TreeShape(kind="static", branching=(3, 2, 1), children="sampled"), **draft),
        "parallel-head": SpeculativeConfig(method="parallel-head", model=str(head), result_cache="prompt"),
        "hidden-state": SpeculativeConfig(method="hidden-state", model=str(hidden), draft_quant="none"),
        "eagle3": SpeculativeConfig(method="eagle3", model=str(eagle)),
        "draft-model-auto": SpeculativeConfig(method="draft-model", budget="auto", **draft),
        "draft-tree-auto": SpeculativeConfig(method="draft-tree", budget="auto", **draft),
        "parallel-head-auto": SpeculativeConfig(method="parallel-head", model=str(head), budget="auto"),
        "hidden-state-auto": SpeculativeConfig(method="hidden-state", model=str(hidden), budget="auto",
                                               draft_quant="none"),
        "eagle3-auto": SpeculativeConfig(method="eagle3", model=str(eagle), budget="auto"),
    }
    return {name: plain.with_speculative(spec) for name, spec in specs.items()}


def seeded(params: SamplingParams, seed: int) -> SamplingParams:
    return params if params.greedy else replace(params, seed=seed)


def fresh_engine(pipe):
    """The pipe's configuration with a drafter state of its own."""
    return pipe.with_speculative(pipe.speculative).engine


# --- speculative == plain ------------------------------------------------------------------


@pytest.mark.parametrize("which", list(PARAMS))
def test_speculative_output_is_plain_seeded_output(plain, pipes, which):
    """Every drafter, tree and budget gives plain decoding's tokens, token for token, with drafts accepted."""
    params = PARAMS[which]
    expected = {(i, s): plain.engine.generate(p, seeded(params, s)).tokens
                for i, p in enumerate(PROMPTS) for s in (11, 12)}
    accepted = {}
    for name, pipe in pipes.items():
        accepted[name] = 0
        for (i, seed), want in expected.items():
            result = pipe.engine.generate(PROMPTS[i], seeded(params, seed))
            assert result.tokens == want, (name, i, seed)
            accepted[name] += result.stats.accepted_tokens
    assert all(accepted[n] > 0 for n in ("prompt-lookup", "draft-model", "draft-tree", "draft-tree-auto")), accepted
    if not params.greedy:  # the seed matters
        assert expected[(0, 11)] != expected[(0, 12)]


@pytest.mark.parametrize("budget", [None, "batch-aware", "fixed"])
@pytest.mark.parametrize("which", list(PARAMS))
def test_in_a_batch_of_four_each_request_is_plain_seeded_output(plain, pipes, which, budget):
    """Each drafter's requests beside three others (other drafters, seeds, temperatures) give plain decoding's
    tokens alone; the batch's budget cuts the drafts it verifies."""
    policy = {None: None, "batch-aware": BatchAwareBudget(cost=lambda n: 1.0 + 0.02 * n),
              "fixed": FixedByBatchSize()}[budget]
    params = PARAMS[which]
    other = SamplingParams(temperature=1.0, seed=5, max_new_tokens=18, ignore_eos=True)
    for name, pipe in pipes.items():
        mine = [(PROMPTS[0], seeded(params, 21)), (PROMPTS[2], seeded(params, 22))]
        alone = [plain.engine.generate(p, s).tokens for p, s in mine]
        batch = pipe.batch_engine(policy, max_batch=4)
        collected = [submit(batch, p, s) for p, s in mine]
        others = [submit(batch, PROMPTS[1], other, fresh_engine(pipes["draft-tree"])),
                  submit(batch, PROMPTS[3], SAMPLED, fresh_engine(pipes["eagle3"]))]
        batch.run()
        assert [c.tokens for c in collected] == alone, name
        assert all(c.error is None for c in collected + others)
        assert others[0].tokens == plain.engine.generate(PROMPTS[1], other).tokens


def test_the_same_request_twice_gives_the_same_tokens(plain, pipes):
    """Drafters that learn between requests (auto budget, result cache) draft differently the second time; the
    tokens stay the same. Without a seed each request draws fresh noise."""
    for name in ("parallel-head", "eagle3-auto", "draft-model-auto", "none"):
        engine = pipes[name].engine
        first, second = (engine.generate(PROMPTS[0], SAMPLED).tokens for _ in range(2))
        assert first == second == plain.engine.generate(PROMPTS[0], SAMPLED).tokens, name
    fresh = replace(SAMPLED, seed=None, sampling="coupled")
    outputs = {tuple(plain.engine.generate(PROMPTS[0], fresh).tokens) for _ in range(3)}
    assert len(outputs) > 1


def test_which_rule_a_request_gets(plain):
    """Coupled with a seed (or when asked); the rejection rule without a seed or when asked; greedy needs no noise."""
    engine = plain.engine
    assert engine.start(PROMPTS[0], SAMPLED).noise.seed == 11
    assert engine.start(PROMPTS[0], replace(SAMPLED, sampling="rejection")).noise is None
    assert engine.start(PROMPTS[0], replace(SAMPLED, seed=None)).noise is None
    fresh = [engine.start(PROMPTS[0], replace(SAMPLED, seed=None, sampling="coupled")).noise.seed for _ in range(2)]
    assert fresh[0] != fresh[1]
    assert engine.start(PROMPTS[0], replace(GREEDY, seed=3)).noise is None


@pytest.mark.parametrize("bad, message", [(dict(sampling="gumbel"), "sampling must be"),
                                          (dict(seed="7"), "seed must be an integer"),
                                          (dict(seed=2**64), "seed must be an integer"),
                                          (dict(seed=True), "seed must be an integer")])
def test_invalid_sampling_parameters(bad, message):
    with pytest.raises(ForetellError, match=message):
        SamplingParams(temperature=1.0, **bad)


# --- drafters draft with the verifier's noise --------------------------------------------------


DRAFTER_MODULES = {"draft-model": "draft_model", "draft-tree": "draft_tree", "draft-tree-static-sampled": "draft_tree",
                   "parallel-head": "parallel_tree", "hidden-state": "hidden_tree", "eagle3": "eagle_tree"}


@pytest.mark.parametrize("name", list(DRAFTER_MODULES))
def test_drafters_rank_with_the_noise_of_the_positions_they_draft(plain, pipes, name, monkeypatch):
    """An oracle ranking that knows plain decoding's output puts its token at the sequence index the drafter names
    first: with the right indices every pass accepts several drafts."""
    import importlib

    want = PROMPTS[0] + plain.engine.generate(PROMPTS[0], SAMPLED).tokens
    calls = []

    def oracle(logits, params, noise, index, ids=None):
        assert noise is not None and noise.seed == SAMPLED.seed
        calls.append(index)
        rows = logits.reshape(-1, logits.shape[-1])
        indices = [index] * rows.shape[0] if isinstance(index, int) else list(index)
        out = torch.zeros(rows.shape)
        for row, i in zip(out, indices):
            token = want[i] if i < len(want) else 0
            column = token if ids is None else (ids == token).nonzero().flatten().tolist()
            row[column] = 1.0  # a token outside the drafter's vocabulary: an empty list, nothing set
        return out.reshape(logits.shape)

    monkeypatch.setattr(importlib.import_module(f"foretell.drafters.{DRAFTER_MODULES[name]}"), "draft_ranking", oracle)
    result = pipes[name].engine.generate(PROMPTS[0], SAMPLED)
    assert result.tokens == want[len(PROMPTS[0]):]
    assert calls and result.stats.tau > 2.0, (name, result.stats.tau)


# --- the noise and the Gumbel-max token ------------------------------------------------------


def test_noise_is_a_function_of_seed_position_and_token():
    noise = GumbelNoise(seed=5, origin=10, vocab_size=1000)
    ids = torch.arange(1000)
    full = noise.values(12, ids)
    assert full.dtype == torch.float64 and torch.isfinite(full).all() and float(full.max()) <= GUMBEL_MAX
    assert torch.equal(noise.values(12, ids[[7, 3, 999]]), full[[7, 3, 999]])  # any subset, any order
    assert torch.equal(GumbelNoise(5, 0, 1000).values(2, ids), full)  # keyed by the output position
    assert not torch.equal(noise.values(13, ids), full)
    assert not torch.equal(GumbelNoise(6, 10, 1000).values(12, ids), full)
    kept = GumbelNoise(5, 10, 1000)  # a drafter's reads keep whole rows: the same values
    assert torch.equal(kept.values(12, ids[[7, 3]], keep_row=True), full[[7, 3]])
    assert torch.equal(kept.values(12, ids), full) and torch.equal(kept.values(12, torch.tensor([1500])),
                                                                   noise.values(12, torch.tensor([1500])))
    rows = noise.values([12, 13], ids[:5].expand(2, -1))
    assert torch.equal(rows[0], full[:5]) and torch.equal(rows[1], noise.values(13, ids[:5]))
    # Gumbel(0, 1): mean Euler's constant, variance pi^2 / 6
    many = noise.values(3, torch.arange(200_000))
    assert abs(float(many.mean()) - 0.5772) < 0.01 and abs(float(many.var()) - 1.6449) < 0.03


@pytest.mark.parametrize("spread", [0.5, 5.0, 60.0])
def test_coupled_token_is_the_full_argmax(spread):
    """The few-candidate search, and the whole kept row, equal argmax(scores + G) over the whole vocabulary; cut
    tokens are never chosen."""
    g = torch.Generator().manual_seed(0)
    noise = GumbelNoise(seed=1, origin=0, vocab_size=3000)
    vocab = 3000
    for position in range(40):
        scores = torch.randn(vocab, generator=g) * spread
        if position % 3 == 0:
            scores[torch.rand(vocab, generator=g) < 0.5] = float("-inf")
        full = scores.double() + noise.values(position, torch.arange(vocab))
        if position % 2:
            noise.row(position)  # kept, as after a drafter's reads: the same token from the whole row
        assert coupled_token(scores, noise, position) == int(full.argmax())


def test_verification_follows_the_target_token_position_by_position():
    """Chains and trees: accept while a draft is the coupled token at its position, then hand out that token."""
    params = SamplingParams(temperature=1.0)
    logits = torch.randn(5, 16, generator=torch.Generator().manual_seed(2))
    coupling = Coupling(GumbelNoise(seed=3, origin=0, vocab_size=16), 7)
    best = [coupling.token(logits[i], params, i) for i in range(5)]
    chain = Proposal(torch.tensor([best[0], best[1], (best[2] + 1) % 16, best[3]]))
    verdict = verify_coupled(logits, chain, params, coupling)
    assert (verdict.accepted, verdict.next_token) == (2, best[2])
    # a tree: a wrong sibling first, then the right one, whose row is slot 2
    tree = Proposal(torch.tensor([(best[0] + 1) % 16, best[0]]), parents=torch.tensor([-1, -1]))
    verdict = verify_coupled(logits[:3], tree, params, coupling)
    assert verdict.path == [1] and verdict.next_token == coupling.token(logits[2], params, 1)


def test_lossy_mode_decides_the_rest_past_the_waived_prefix():
    from foretell.lossy import verify_controlled

    params = SamplingParams(temperature=1.0)
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(4))
    coupling = Coupling(GumbelNoise(seed=9, origin=0, vocab_size=16), 0)
    chain = Proposal(torch.tensor([3, 5, 7]), draft_prob=torch.tensor([0.99, 0.1, 0.1]))  # the first one waived
    verdict = verify_controlled(logits, chain, params, None, 0.9, coupling)
    rest = verify_coupled(logits[1:], Proposal(torch.tensor([5, 7])), params, coupling.after(1))
    assert verdict.waived == 1 and (verdict.accepted, verdict.next_token) == (1 + rest.accepted, rest.next_token)


# --- the command line, the bench and the server's request field ----------------------------------


def test_cli_seeded_generate_gives_the_same_tokens_with_and_without_a_drafter(tiny_pair, capsys):
    import json

    from foretell.cli import main

    target, draft = tiny_pair
    common = ["generate", "w5 w6 w7", "--model", str(target), "--dtype", "float32", "--max-new-tokens", "12",
              "--temperature", "0.8", "--top-p", "0.95", "--seed", "4", "--json"]
    outputs = []
    for extra in (["--drafter", "none"], ["--draft", str(draft)], ["--draft", str(draft), "--sampling", "coupled"]):
        assert main(common + extra) == 0
        outputs.append(json.loads(capsys.readouterr().out)["tokens"])
    assert outputs[0] == outputs[1] == outputs[2]
    assert main(common + ["--draft", str(draft), "--sampling", "rejection"]) == 0
    with pytest.raises(SystemExit):
        main(common + ["--sampling", "gumbel"])


def test_bench_and_server_take_the_rule():
    from foretell.bench.methods import MethodOptions, sampling
    from foretell.cli import build_parser
    from foretell.serve.protocol import ChatCompletionRequest, CompletionRequest

    args = build_parser().parse_args(["bench", "--temperature", "0.7", "--seed", "1", "--sampling", "rejection"])
    opts = MethodOptions(temperature=args.temperature, seed=args.seed, sampling=args.sampling)
    assert sampling(opts, 8).sampling == "rejection" and not sampling(opts, 8).coupled
    assert sampling(MethodOptions(temperature=0.7, seed=1), 8).coupled
    with pytest.raises(ForetellError, match="sampling must be"):
        MethodOptions(temperature=0.7, sampling="gumbel")
    body = {"model": "m", "prompt": "x", "seed": 3, "temperature": 0.5}
    assert CompletionRequest.model_validate({**body, "sampling": "rejection"}).sampling(8).sampling == "rejection"
    assert CompletionRequest.model_validate(body).sampling(8).coupled
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "sampling": "coupled"}
    assert ChatCompletionRequest.model_validate(chat).sampling(8).coupled  # no seed: a fresh one per request
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({**body, "sampling": "gumbel"})
