"""The whole engine samples exactly the target's distribution (draft length 4, tiny model), under both
sampling rules: speculative sampling's rejection rule and the coupled rule (coupled.py).

The exact distribution of each of the first five generated tokens is computed by enumerating
every prefix with transformers' reference model; the engine's samples must match it at every
position, and the same test must reject a verifier with a known bias.
"""

from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

import foretell.verify
from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.sampling import processed_probs
from foretell.types import SamplingParams
from test_verify_statistical import accept_if_argmax_coupled, accept_if_argmax_rule

VOCAB, NEW, GAMMA, RUNS = 8, 5, 4, 1500
PROMPT = [1, 4, 6, 3]
RULES = ("rejection", "coupled")  # SamplingParams.sampling


def exact_marginals(hf_model, params: SamplingParams) -> torch.Tensor:
    """[NEW, VOCAB]: the target's distribution of each generated token, by enumeration."""
    prefixes = torch.tensor([PROMPT])
    weights = torch.ones(1, dtype=torch.float64)
    marginals = []
    with torch.no_grad():
        for _ in range(NEW):
            p = processed_probs(hf_model(prefixes).logits[:, -1], params).double()  # [P, V]
            marginals.append((weights[:, None] * p).sum(0))
            weights = (weights[:, None] * p).reshape(-1)
            prefixes = torch.cat(
                [prefixes.repeat_interleave(VOCAB, 0), torch.arange(VOCAB).repeat(len(prefixes))[:, None]], dim=1
            )
    return torch.stack(marginals)


def make_pipe(root, drafter: str):
    from foretell.drafters.draft_model import DraftModelDrafter
    from foretell.drafters.draft_tree import DraftTreeDrafter
    from foretell.config import TreeShape
    from foretell.hot_vocab import HotVocab

    pipe = load(root / "t", SpeculativeConfig(method="draft-model", model=str(root / "d"), gamma=GAMMA, draft_quant="none"))
    shapes = {
        "tree-sampled": TreeShape(kind="static", branching=(3, 2, 1, 1), children="sampled"),
        "tree-topk": TreeShape(kind="dynamic", depth=4, top_k=3, total_tokens=10),
    }
    if drafter in shapes:
        return pipe.with_drafter(DraftTreeDrafter(pipe.engine.drafter.model, VOCAB, shapes[drafter]))
    if drafter == "chain-hot":  # q is zero outside 5 of the 8 tokens
        hot = HotVocab(torch.tensor([0, 2, 3, 5, 6]), VOCAB)
        return pipe.with_drafter(DraftModelDrafter(pipe.engine.drafter.model, VOCAB, hot), gamma=GAMMA)
    return pipe


def engine_counts(root, params: SamplingParams, drafter: str = "chain") -> torch.Tensor:
    pipe = make_pipe(root, drafter)
    counts = torch.zeros(NEW, VOCAB)
    for seed in range(RUNS):
        p = SamplingParams(**{**params.__dict__, "seed": seed, "max_new_tokens": NEW, "ignore_eos": True})
        tokens = pipe.engine.generate(PROMPT, p).tokens
        assert len(tokens) == NEW
        counts[torch.arange(NEW), torch.tensor(tokens)] += 1
    return counts


MIN_EXPECTED = 5.0  # Pearson's chi-square is only valid when every cell expects about 5 or more


def worst_p_value(counts: torch.Tensor, exact: torch.Tensor) -> float:
    """The smallest per-position chi-square p-value of the counts against the exact marginals.

    A token of zero probability must never appear. Tokens expected fewer than MIN_EXPECTED times
    share one cell: one hit on a token expected 0.03 times would otherwise read as p ~ 1e-8."""
    worst = 1.0
    for c, e in zip(counts, exact):
        keep = e > 1e-12
        assert c[~keep].sum() == 0
        observed, expected = c[keep].double(), (e[keep] / e[keep].sum() * c.sum()).double()
        big = expected >= MIN_EXPECTED
        obs, exp = observed[big].tolist(), expected[big].tolist()
        rest_obs, rest_exp = float(observed[~big].sum()), float(expected[~big].sum())
        if rest_exp >= 1.0 or (rest_exp > 0 and not obs):
            obs.append(rest_obs)
            exp.append(rest_exp)
        elif rest_exp > 0:  # too small even pooled: fold it into the smallest cell
            i = min(range(len(exp)), key=exp.__getitem__)
            obs[i] += rest_obs
            exp[i] += rest_exp
        if len(obs) >= 2:
            worst = min(worst, chisquare(obs, exp).pvalue)
    return worst


def assert_tree_samples_follow_target(spec, hf_target, params: SamplingParams, rules=RULES) -> None:
    """RUNS seeded runs of a tree drafter's pipeline `spec` on the micro model under each sampling rule: the first
    NEW tokens follow the exact marginals, and enough drafts are accepted for the test to exercise accepted tree
    paths."""
    exact = exact_marginals(hf_target, params)
    for rule in rules:
        counts = torch.zeros(NEW, VOCAB)
        accepted = 0
        for seed in range(RUNS):
            p = SamplingParams(**{**params.__dict__, "seed": seed, "max_new_tokens": NEW, "ignore_eos": True,
                                  "sampling": rule})
            result = spec.engine.generate(PROMPT, p)
            counts[torch.arange(NEW), torch.tensor(result.tokens)] += 1
            accepted += sum(result.stats.accepted_per_position)
        assert accepted > 500, f"the test should exercise accepted tree paths ({rule})"
        assert worst_p_value(counts, exact) > 1e-3 / NEW, rule


PARAMS = {"t1.0": SamplingParams(temperature=1.0), "t0.7-top_p0.9": SamplingParams(temperature=0.7, top_p=0.9)}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("drafter", ["chain", "tree-sampled", "tree-topk", "chain-hot"])
@pytest.mark.parametrize("params", list(PARAMS))
def test_engine_samples_follow_target(micro, params, drafter, rule):
    target, root = micro
    exact = exact_marginals(target, PARAMS[params])
    assert worst_p_value(engine_counts(root, replace(PARAMS[params], sampling=rule), drafter), exact) > 1e-3 / NEW


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("params", list(PARAMS))
def test_the_same_test_rejects_a_biased_verifier(micro, params, rule, monkeypatch):
    target, root = micro
    biased = accept_if_argmax_rule if rule == "rejection" else accept_if_argmax_coupled
    monkeypatch.setattr(foretell.verify, "verify", biased)  # what the lossless verifier calls
    counts = engine_counts(root, replace(PARAMS[params], sampling=rule))
    assert worst_p_value(counts, exact_marginals(target, PARAMS[params])) < 1e-6
