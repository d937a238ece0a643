"""bf16 products on AMX tiles (kernels/lean_decode.cpp kind BF16A; runtime/lean_step.amx_tiles): on a CPU with AMX a
bf16 model's lean passes round their activations to bf16 and sum in fp32, as a bf16 matrix product does. Each row
gets the same bits whatever the pass's width, so speculation over them stays exact. Skipped where the CPU has no
AMX or Linux does not grant its tile state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_drafters_reproduce_plain
from foretell.api import load
from foretell.kernels import amx_products, block_gemm, lean_module
from foretell.runtime import wide_linear
from foretell.runtime.lean_step import BF16A, BF16X, LeanStep, amx_tiles
from foretell.runtime.quant import describe_target

pytestmark = pytest.mark.skipif(not amx_products(), reason="this CPU has no AMX tiles (or Linux grants no tile state)")


@pytest.mark.parametrize(("out", "cols"), [(48, 64), (80, 96), (16, 32)])
def test_amx_products_are_bf16_products_and_each_row_computes_what_it_does_alone(out, cols):
    """1..40 rows (passes of up to 16, so one to three of them, the last partly filled): the fp32 product of the
    bf16-rounded activations and the weight, and each row bit for bit what it gives alone."""
    g = torch.Generator().manual_seed(out)
    weight = torch.randn(out, cols, generator=g).bfloat16()
    x = torch.randn(40, cols, generator=g)
    want = x.bfloat16().double() @ weight.double().T
    kind, packed = amx_tiles(weight)
    assert kind == BF16A and packed.shape == (out // 16, cols // 2, 32)
    gemm = block_gemm()
    for rows in (1, 2, 7, 16, 17, 33, 40):
        y = gemm(x[:rows], BF16A, packed, torch.empty(0))
        torch.testing.assert_close(y.double(), want[:rows], rtol=1e-5, atol=1e-4)
        assert all(torch.equal(y[r], gemm(x[r:r + 1], BF16A, packed, torch.empty(0))[0]) for r in range(rows))
    assert not torch.equal(gemm(x[:4], BF16A, packed, torch.empty(0)), F.linear(x[:4], weight.float()))


def test_shapes_the_tiles_do_not_fit_keep_the_column_layout():
    assert amx_tiles(torch.randn(48, 40).bfloat16())[0] == BF16X  # inputs not a multiple of 32
    assert amx_tiles(torch.randn(40, 64).bfloat16())[0] != BF16A  # outputs not a multiple of 16


@pytest.fixture
def native_bf16(monkeypatch):
    monkeypatch.setattr(wide_linear, "native_bf16", lambda: True)


def test_a_bf16_target_multiplies_on_amx_and_every_drafter_reproduces_its_plain_decoding(tiny_pair, native_bf16):
    plain = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False)
    model = plain.target.model
    assert model.lean.amx and BF16A in model.lean.kinds
    assert describe_target("none", "bfloat16", model) == "bf16 weights, bf16 products on AMX"
    assert_drafters_reproduce_plain(plain, tiny_pair[1])


def test_a_float32_model_of_bf16_numbers_keeps_float32_products(tiny_pair, native_bf16):
    """Only a bf16 model's layers (Bf16ProductLinear) take the tiles: a float32 model whose weights happen to be bf16
    numbers keeps fp32 activations (BF16X), the arithmetic its dtype promises."""
    model = load(tiny_pair[0], "none", warm_up=False).target.model
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    assert set(LeanStep(model).kinds) == {BF16X}


def test_amx_off_packs_the_column_layout_again(tiny_pair, native_bf16):
    module = lean_module()
    try:
        assert module.lean_amx(False) is False and not amx_products()
        model = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False).target.model
        assert not model.lean.amx and BF16X in model.lean.kinds
        with pytest.raises(RuntimeError, match="BF16A weights need AMX"):
            block_gemm()(torch.randn(1, 32), BF16A, torch.zeros(1, 16, 32, dtype=torch.bfloat16), torch.empty(0))
    finally:
        module.lean_amx(True)
    assert amx_products()


def test_a_bf16_targets_amx_steps_are_as_close_to_float32_as_pytorchs_bf16_ones(tiny_pair, native_bf16):
    """The tiles compute a bf16 model at least as faithfully as PyTorch's bf16 path (which also rounds every
    activation to bf16, where the lean step keeps them fp32 between products): a prompt, then one-token steps, each
    logit's distance to the float32 model's."""
    models = {"amx": load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False).target.model,
              "torch": load(tiny_pair[0], "none", dtype="bfloat16", lean=False, warm_up=False).target.model,
              "float32": load(tiny_pair[0], "none", dtype="float32", warm_up=False).target.model}
    assert models["amx"].lean.amx and models["torch"].dtype == torch.bfloat16
    tokens = torch.tensor([1, 5, 9, 12, 5, 9, 30, 7, 7, 3, 4, 20, 21, 22])
    logits = {}
    with torch.inference_mode():
        for name, model in models.items():
            cache = model.new_cache(32)
            model(tokens[:8], torch.arange(8), cache)
            cache.commit_prefix(8)
            steps = []
            for i in range(8, len(tokens)):
                steps.append(model(tokens[i:i + 1], torch.tensor([i]), cache).logits.float())
                cache.commit_prefix(1)
            logits[name] = torch.cat(steps)
    error = {name: (logits[name] - logits["float32"]).abs() for name in ("amx", "torch")}
    assert error["amx"].mean() <= error["torch"].mean() and error["amx"].max() <= error["torch"].max()
    assert error["amx"].max() < 0.1 * logits["float32"].abs().max()
