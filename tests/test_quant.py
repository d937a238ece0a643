"""Int8 draft weights and the small-step attention path: both must keep decoding exact."""

import pytest
import torch
import torch.nn.functional as F

from foretell.api import load
from foretell.config import SpeculativeConfig, TreeShape
from foretell.errors import ForetellError
from foretell.layer_rows import select_rows
from foretell.models.transformer import small_step_attention
from foretell.runtime.quant import Int8Linear, quantize_int8
from foretell.types import SamplingParams

PROMPTS = [[1, 5, 9, 12, 5, 9, 30], [1, 20, 21, 22, 23, 24, 25, 20, 21, 22], [1]]
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_is_close_to_the_full_precision_layer(dtype):
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(96, 40, bias=True).to(dtype)
    x = torch.randn(2, 3, 96, generator=g).to(dtype)
    quant = Int8Linear.from_weight(layer.weight, layer.bias)
    ref, out = layer(x).float(), quant(x).float()
    assert out.shape == ref.shape
    # Per-row symmetric int8 rounds each weight by at most scale/2: about 0.4% of the row's range.
    assert (out - ref).abs().max() < 0.02 * ref.abs().max()
    assert quant.weight_int8.dtype == torch.int8


def test_select_rows_keeps_exactly_those_rows():
    layer = torch.nn.Linear(32, 50, bias=False)
    rows = torch.tensor([0, 7, 49])
    x = torch.randn(4, 32)
    # Equal up to float rounding: a 3-row matmul may block its sums differently from a 50-row one.
    assert torch.allclose(select_rows(layer, rows)(x), layer(x)[:, rows], atol=1e-6)
    quant = Int8Linear.from_weight(layer.weight)
    assert torch.allclose(select_rows(quant, rows)(x), quant(x)[:, rows], atol=1e-6)


def test_quantize_replaces_every_projection_and_unties_the_head(tiny_pair):
    _, draft = tiny_pair
    model = load(draft, "none", warm_up=False).target.model
    embed = model.embed_tokens.weight.clone()
    quantize_int8(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert isinstance(model.lm_head, Int8Linear)
    assert torch.equal(model.embed_tokens.weight, embed)  # the lookup table stays full precision


@pytest.mark.parametrize("drafter", ["draft-model", "draft-tree"])
def test_int8_draft_greedy_equals_plain(tiny_pair, drafter):
    target, draft = tiny_pair
    plain = load(target, "none")
    shape = {"gamma": 4} if drafter == "draft-model" else {"tree": TreeShape(kind="dynamic", depth=4, top_k=3, total_tokens=10)}
    spec = load(target, SpeculativeConfig(method=drafter, model=str(draft), draft_quant="int8", **shape))
    assert isinstance(spec.engine.drafter.model.lm_head, Int8Linear)
    accepted = 0
    for prompt in PROMPTS:
        result = spec.engine.generate(prompt, GREEDY)
        assert result.tokens == plain.engine.generate(prompt, GREEDY).tokens
        accepted += sum(result.stats.accepted_per_position)
    assert accepted > 0, "an int8 copy of a close draft should still be accepted sometimes"


def test_int8_draft_with_hot_vocab_greedy_equals_plain(tiny_pair):
    target, draft = tiny_pair
    plain = load(target, "none")
    spec = load(target, SpeculativeConfig(method='draft-model', model=str(draft), gamma=3, hot_vocab=32, draft_quant="int8"))
    for prompt in PROMPTS:
        assert spec.engine.generate(prompt, GREEDY).tokens == plain.engine.generate(prompt, GREEDY).tokens


def test_unknown_quant_mode_is_a_clear_error(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ForetellError, match="draft_quant must be one of"):
        load(target, SpeculativeConfig(method='draft-model', model=str(draft), draft_quant="int3"))
    with pytest.raises(ForetellError, match="draft_quant"):
        load(target, SpeculativeConfig(method="prompt-lookup", draft_quant="int8"))
    from foretell.runtime.quant import resolve_quant
    assert resolve_quant("int4", "cpu") == "int4"
    with pytest.raises(ForetellError, match="int4 drafts run on CPU only"):
        resolve_quant("int4", "cuda")


@pytest.mark.parametrize("heads, kv_heads, T", [(4, 4, 1), (4, 2, 3), (6, 2, 5), (8, 1, 16)])
def test_small_step_attention_equals_sdpa(heads, kv_heads, T):
    g = torch.Generator().manual_seed(heads * 100 + T)
    S, D = 11 + T, 8
    q = torch.randn(1, heads, T, D, generator=g)
    k, v = torch.randn(1, kv_heads, S, D, generator=g), torch.randn(1, kv_heads, S, D, generator=g)
    mask = torch.rand(1, 1, T, S, generator=g) > 0.4
    mask[..., 0] = True  # every query sees at least one slot, as in decoding
    for m in (None, mask):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=kv_heads != heads)
        assert torch.allclose(small_step_attention(q, k, v, m), ref, atol=1e-5)
