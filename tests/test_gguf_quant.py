"""A GGUF target keeping its own Q4_1 blocks (quant="gguf"): the int4 layers hold exactly the file's weights,
and every drafter reproduces that model's plain greedy decoding (fp32 activations)."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, greedy_params, make_hf_model
from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.runtime.quant import Int4Linear

gguf = pytest.importorskip("gguf")

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def q4_1_file(tmp_path_factory):
    from test_families_gguf import write_gguf

    root = tmp_path_factory.mktemp("q4_1")
    hf = make_hf_model("llama", 48, seed=5)
    return write_gguf(hf, "llama", root / "tiny-q4_1.gguf", q4_1=lambda name: name.endswith(
        tuple(f"{p}.weight" for p in PROJECTIONS)))


def test_the_files_blocks_are_kept_exactly(q4_1_file, tmp_path):
    dense = load(q4_1_file, "none", warm_up=False, cache_dir=tmp_path).target.model  # dequantized by transformers
    kept = load(q4_1_file, "none", quant="gguf", warm_up=False, cache_dir=tmp_path).target.model
    names = [n for n, m in kept.named_modules() if isinstance(m, Int4Linear)]
    assert len(names) == 4 * len(kept.layers)  # qkv, o, gate_up, down of every layer
    modules = dict(dense.named_modules())
    for name in names:
        assert torch.equal(dict(kept.named_modules())[name].dequantized(), modules[name].weight.float()), name
    assert type(kept.lm_head) is torch.nn.Linear  # F32 in the file: stays dense


def test_every_drafter_reproduces_the_gguf_target(q4_1_file, tmp_path):
    plain = load(q4_1_file, "none", quant="gguf", warm_up=False, cache_dir=tmp_path)
    folder = str(q4_1_file)  # as a draft model: the same file dequantized (then int8), a close draft
    for spec in (SpeculativeConfig(gamma=3), SpeculativeConfig(method="draft-model", model=str(folder)),
                 SpeculativeConfig(method="draft-tree", model=str(folder))):
        pipe = plain.with_speculative(spec)
        for prompt in PROMPTS:
            assert pipe.engine.generate(prompt, greedy_params()).tokens == \
                plain.engine.generate(prompt, greedy_params()).tokens, spec.method


def test_gguf_quantization_needs_a_gguf_file(tiny_pair):
    with pytest.raises(ForetellError, match="has no GGUF file on disk"):
        load(tiny_pair[0], "none", quant="gguf", warm_up=False)
