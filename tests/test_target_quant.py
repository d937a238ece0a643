"""Quantized targets (opt-in, weight-only int8 / int4): a different model from the full-precision one, which
speculation reproduces exactly: greedy with every drafter equals its own plain decoding (fp32 activations),
and sampling follows its own distribution (statistical test)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import PROMPTS, greedy_params
from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models.hidden_draft import new_hidden_draft, save_hidden_draft
from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head, save_parallel_head
from foretell.runtime.quant import Int4Linear, Int8Linear
from foretell.sampling import processed_probs
from foretell.sizing.cost import weight_format
from foretell.types import SamplingParams


@pytest.fixture(scope="module")
def drafter_folders(tiny_pair, tmp_path_factory):
    """A random parallel head and hidden-state draft for the tiny target (made on the full-precision target:
    they only read its hidden states and share its output layer)."""
    root = tmp_path_factory.mktemp("quant-drafters")
    target = load(tiny_pair[0], "none", warm_up=False).target.model
    head = save_parallel_head(new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=3),
                              root / "head")
    hidden = save_hidden_draft(new_hidden_draft(target, seed=4), root / "hidden")
    return {"head": str(head), "hidden": str(hidden)}


def configs(draft: str, folders: dict) -> dict[str, SpeculativeConfig]:
    return {
        "prompt-lookup": SpeculativeConfig(gamma=3),
        "draft-model": SpeculativeConfig(method="draft-model", model=draft, gamma=3),
        "draft-tree": SpeculativeConfig(method="draft-tree", model=draft),
        "parallel-head": SpeculativeConfig(method="parallel-head", model=folders["head"], result_cache="prompt"),
        "hidden-state": SpeculativeConfig(method="hidden-state", model=folders["hidden"], hot_vocab=32),
    }


@pytest.mark.parametrize("quant", ["int8", "int4", "int4-q8"])
def test_every_drafter_reproduces_the_quantized_target(tiny_pair, drafter_folders, quant):
    plain = load(tiny_pair[0], "none", quant=quant, warm_up=False)
    full = load(tiny_pair[0], "none", warm_up=False)
    layer = plain.target.model.layers[0].qkv_proj
    weights = quant.removesuffix("-q8")
    assert isinstance(layer, Int4Linear if weights == "int4" else Int8Linear)
    assert weight_format(plain.target.model) == weights
    expected = [plain.engine.generate(p, greedy_params()).tokens for p in PROMPTS]
    assert expected != [full.engine.generate(p, greedy_params()).tokens for p in PROMPTS]  # another model
    accepted = 0
    for name, spec in configs(str(tiny_pair[1]), drafter_folders).items():
        pipe = plain.with_speculative(spec)
        for prompt, want in zip(PROMPTS, expected):
            result = pipe.engine.generate(prompt, greedy_params())
            assert result.tokens == want, (quant, name)
            accepted += result.stats.accepted_tokens
    assert accepted > 0


def test_bad_quantization_is_refused_before_loading(tmp_path):
    with pytest.raises(ForetellError, match="unknown target quantization 'int2'; use one of none, int8, int4"):
        load(tmp_path / "no-model", "none", quant="int2")


def last_logits(model, prefixes: torch.Tensor) -> torch.Tensor:
    """[B, V]: the logits after each prefix [B, T]; with 8-bit activations through the lean step, which is that
    model (a cacheless batch runs PyTorch's float path)."""
    if model.lean is None or not model.lean.act_q8:
        return model.forward_sequences(prefixes).logits[:, -1]
    return torch.stack([model(ids, torch.arange(len(ids)), model.new_cache(len(ids))).logits[-1] for ids in prefixes])


def exact_marginals(model, prompt: list[int], params: SamplingParams, new: int, vocab: int) -> torch.Tensor:
    """[new, vocab]: the distribution of each generated token under `model`, by enumerating every prefix."""
    prefixes = torch.tensor([prompt])
    weights = torch.ones(1, dtype=torch.float64)
    marginals = []
    with torch.inference_mode():
        for _ in range(new):
            p = processed_probs(last_logits(model, prefixes).float(), params).double()
            marginals.append((weights[:, None] * p).sum(0))
            weights = (weights[:, None] * p).reshape(-1)
            prefixes = torch.cat([prefixes.repeat_interleave(vocab, 0),
                                  torch.arange(vocab).repeat(len(prefixes))[:, None]], dim=1)
    return torch.stack(marginals)


@pytest.mark.parametrize("quant", ["int8", "int4", "int4-q8"])
def test_sampling_follows_the_quantized_target(micro, quant):
    """Speculative sampling at temperature 1 on a quantized target matches that target's exact distribution."""
    from test_engine_statistical import GAMMA, NEW, PROMPT, RUNS, VOCAB, worst_p_value

    _, root = micro
    pipe = load(root / "t", SpeculativeConfig(method="draft-model", model=str(root / "d"), gamma=GAMMA),
                quant=quant, warm_up=False)
    params = SamplingParams(temperature=1.0)
    exact = exact_marginals(pipe.target.model, PROMPT, params, NEW, VOCAB)
    counts = torch.zeros(NEW, VOCAB)
    for seed in range(RUNS):
        tokens = pipe.engine.generate(PROMPT, SamplingParams(temperature=1.0, seed=seed, max_new_tokens=NEW,
                                                             ignore_eos=True)).tokens
        counts[torch.arange(NEW), torch.tensor(tokens)] += 1
    assert worst_p_value(counts, exact) > 1e-3 / NEW


def test_compiled_steps_decode_exactly(tiny_pair):
    """torch.compile of the per-layer blocks (opt-in) changes no token: greedy plain and speculative decoding
    equal the eager model's (fp32)."""
    eager = load(tiny_pair[0], "none", warm_up=False)
    compiled = load(tiny_pair[0], "none", compile=True, warm_up=False)
    assert compiled.target.model.compiled and not eager.target.model.compiled
    lookup = compiled.with_speculative(SpeculativeConfig(gamma=3))
    for prompt in PROMPTS[:2]:
        want = eager.engine.generate(prompt, greedy_params(16)).tokens
        assert compiled.engine.generate(prompt, greedy_params(16)).tokens == want
        assert lookup.engine.generate(prompt, greedy_params(16)).tokens == want


def test_foretell_cost_times_the_quantized_target(tiny_pair, tmp_path, monkeypatch, capsys):
    """`foretell cost --quant` times the target as `generate --quant` runs it, in a curve of its own (the cache key
    names the weights and the activations), and a -q8 mode takes float32 without being told."""
    from foretell.sizing.cost import machine_key
    from foretell.cli import main

    monkeypatch.setenv("FORETELL_CACHE", str(tmp_path / "cache"))
    assert main(["cost", str(tiny_pair[0]), "--quant", "int4-q8", "--plot", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "(float32, int4-q8) (lean step, 8-bit activations)" in out and "against one token: 1:1.00x" in out
    assert main(["cost", str(tiny_pair[0]), "--quant", "int4-q8", "--dtype", "bfloat16",
                 "--plot", str(tmp_path / "c.png")]) == 2
    assert "--dtype float32" in capsys.readouterr().err
    keys = [machine_key(load(tiny_pair[0], "none", quant=q, warm_up=False).target.model, "tiny")
            for q in ("none", "int4", "int4-q8")]
    assert len({json.dumps(k, sort_keys=True) for k in keys}) == 3
