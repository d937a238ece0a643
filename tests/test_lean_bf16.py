"""bf16 weights in the lean step (kernels/lean_decode.cpp kinds BF16 and BF16X; runtime/lean_step.py): dense weights
holding bf16 numbers are streamed as bf16, and a bf16 target on a CPU whose bf16 products are emulated runs as
float32 activations over them. Products match the dense fp32 ones, every row computes what it computes alone, and
every drafter reproduces that target's plain greedy decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import PROMPTS, assert_drafters_reproduce_plain, greedy_params
from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.kernels import amx_products, block_gemm, lean_decode
from foretell.runtime import wide_linear
from foretell.runtime.drafter_modules import use_lean_step
from foretell.runtime.lean_step import BF16, BF16A, BF16X, F32, LeanStep, bf16_interleaved
from foretell.runtime.quant import describe_target

pytestmark = pytest.mark.skipif(lean_decode() is None, reason="the lean step's kernel cannot be built on this machine")


@pytest.mark.parametrize(("out", "cols"), [(48, 44), (40, 96)])
def test_bf16_products_match_dense_and_the_one_row_sums(out, cols):
    """1..13 rows times a bf16 weight, row layout (BF16, also with an input tail that is not a multiple of 8) and
    16 columns interleaved (BF16X, where the output count allows; passes of up to 6 rows, so one to three of
    them): the fp32 product of the same values, and each row bit for bit what it gives alone (a verification pass
    computes a one-token step's sums)."""
    g = torch.Generator().manual_seed(out)
    weight = torch.randn(out, cols, generator=g).bfloat16()
    x = torch.randn(13, cols, generator=g)
    want = x.double() @ weight.double().T
    gemm = block_gemm()
    kind, packed = bf16_interleaved(weight)
    assert kind == (BF16X if out % 16 == 0 else BF16)
    for layout, main in {BF16: weight, kind: packed}.items():
        for rows in range(1, 14):
            y = gemm(x[:rows], layout, main, torch.empty(0))
            torch.testing.assert_close(y.double(), want[:rows], rtol=1e-5, atol=1e-4)
            assert all(torch.equal(y[r], gemm(x[r:r + 1], layout, main, torch.empty(0))[0]) for r in range(rows))


def test_only_weights_of_bf16_numbers_are_read_as_bf16(tiny_pair):
    model = load(tiny_pair[0], "none", warm_up=False).target.model  # random fp32 weights: not bf16 numbers
    assert model.lean is not None and not model.lean.streams_bf16 and set(model.lean.kinds) == {F32}
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    assert set(LeanStep(model).kinds) == {BF16X} and set(LeanStep(model, bf16=False).kinds) == {F32}


def test_one_bf16_packing_a_weight_shared_by_target_and_drafter(tiny_pair):
    """A drafter reading the target's own output layer (no hot vocabulary) reuses the target's packing of it rather
    than a second copy; a changed weight is packed anew."""
    from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head

    model = load(tiny_pair[0], "none", warm_up=False).target.model
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    step = LeanStep(model)
    head = new_parallel_head(model, ParallelHeadConfig.for_target(model.config))
    assert use_lean_step(head) is None and head.lean.output is not None
    assert head.lean.output[2].data_ptr() == step.head[1].data_ptr()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # still bf16 numbers, new values
    assert LeanStep(model).head[1].data_ptr() != step.head[1].data_ptr()


def bf16_emulated(monkeypatch, emulated: bool = True) -> None:
    monkeypatch.setattr(wide_linear, "native_bf16", lambda: not emulated)


def test_a_bf16_target_runs_as_float32_over_its_bf16_weights_where_bf16_is_emulated(tiny_pair, monkeypatch):
    bf16_emulated(monkeypatch)
    reference = load(tiny_pair[0], "none", dtype="bfloat16", lean=False, warm_up=False).target.model
    pipe = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False)
    model = pipe.target.model
    assert reference.dtype == torch.bfloat16 and model.dtype == torch.float32
    assert model.lean is not None and model.lean.streams_bf16 and BF16X in model.lean.kinds
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q.float()), name  # the same values, now with float32 activations
    assert model.new_cache(8).k.dtype == torch.float32
    assert describe_target("none", "bfloat16", model) == "bf16 weights, float32 activations"
    assert describe_target("none", "bfloat16", reference) == "bfloat16"
    assert load(tiny_pair[0], "none", dtype="bfloat16", lean=False, warm_up=False).target.model.lean is None


def test_where_bf16_is_native_the_passes_the_lean_step_does_not_take_multiply_in_bf16(tiny_pair, monkeypatch):
    """On an AMX / AVX512-BF16 CPU the target runs as float32 activations over its bf16 weights too (the lean step
    beats PyTorch's bf16 step 3x there), and its prompts keep bf16 products on a bf16 copy of each weight."""
    bf16_emulated(monkeypatch, False)
    model = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False).target.model
    assert model.dtype == torch.float32 and model.lean is not None and model.lean.streams_bf16
    assert wide_linear.bf16_rows_of(model) == wide_linear.BF16_PRODUCT_ROWS
    proj = model.layers[0].gate_up_proj
    assert isinstance(proj, wide_linear.Bf16ProductLinear) and proj.weight_bf16.dtype == torch.bfloat16
    x = torch.randn(12, proj.in_features)
    with torch.inference_mode():
        wide, narrow = proj(x), proj(x[:7])
    assert wide.dtype == torch.float32 and torch.equal(wide, F.linear(x.bfloat16(), proj.weight_bf16).float())
    assert torch.equal(narrow, F.linear(x[:7], proj.weight))  # fewer rows: float32, as before
    bf16_emulated(monkeypatch)  # where bf16 is emulated the float32 model keeps float32 products
    model = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False).target.model
    assert model.dtype == torch.float32 and wide_linear.bf16_rows_of(model) == 0


def test_where_bf16_is_native_every_drafter_reproduces_plain_decoding(tiny_pair, monkeypatch):
    bf16_emulated(monkeypatch, False)
    plain = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False)
    model = plain.target.model
    assert model.lean.streams_bf16 and wide_linear.bf16_rows_of(model) == wide_linear.BF16_PRODUCT_ROWS
    assert_drafters_reproduce_plain(plain, tiny_pair[1])  # its long prompt: a prefill in bf16 products


@pytest.mark.parametrize("emulated", [True, False])
@pytest.mark.parametrize("count", [6, 40])
def test_a_verification_pass_over_bf16_weights_computes_each_one_token_step(tiny_pair, monkeypatch, emulated, count):
    """Also where bf16 is native (on a CPU with AMX the lean passes then multiply on its tiles, BF16A), and for a
    pass longer than one lean call takes (a large tree: in chunks, not in PyTorch's products)."""
    bf16_emulated(monkeypatch, emulated)
    model = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False).target.model
    assert model.lean.amx is (not emulated and amx_products())
    assert count <= model.lean.max_rows or model.lean.takes(count, 4) and not model.lean.takes(count, 0)
    assert model.lean.takes(100, 4, tree=True) and not model.lean.takes(100, 4)  # any tree; long chains: prompts
    context = torch.tensor([1, 5, 9, 12])
    tokens = torch.randint(0, model.config.vocab_size, (count,), generator=torch.Generator().manual_seed(count))
    caches = [model.new_cache(64) for _ in range(2)]
    for cache in caches:
        model(context, torch.arange(4), cache)
        cache.commit_prefix(4)
    whole = model(tokens, torch.arange(4, 4 + count), caches[0], hidden_layers=(1,))
    for i, token in enumerate(tokens):
        step = model(token[None], torch.tensor([4 + i]), caches[1], hidden_layers=(1,))
        caches[1].commit_prefix(1)
        assert torch.equal(step.logits[0], whole.logits[i]) and torch.equal(step.hidden[1][0], whole.hidden[1][i])


def test_every_drafter_reproduces_plain_decoding_over_bf16_weights(tiny_pair, monkeypatch):
    bf16_emulated(monkeypatch)
    plain = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False)
    assert plain.target.model.lean.streams_bf16
    assert_drafters_reproduce_plain(plain, tiny_pair[1])  # its long prompt: a PyTorch float32 prefill


@pytest.mark.parametrize("emulated", [True, False])
def test_an_eagle3_head_for_such_a_target_steps_natively_and_stays_exact(tiny_pair, tmp_path, monkeypatch, emulated):
    """Drafters load with the target's float32 activations: an EAGLE-3 head gets its own lean step, and where bf16
    is native its long passes (prompt feeds) multiply in bf16 as the target's do."""
    from foretell.drafters.eagle_tree import Eagle3Drafter
    from foretell.models.eagle3 import Eagle3Config, new_eagle3_head, save_eagle3_head
    from foretell.runtime.loading import build_model

    bf16_emulated(monkeypatch, emulated)
    target = build_model(tiny_pair[0], torch.float32)
    head = new_eagle3_head(target, Eagle3Config.for_target(target.config, draft_vocab_size=40), seed=1)
    with torch.no_grad():  # as a head trained in bf16: its fc then runs in the column kernel
        head.fc.weight.copy_(head.fc.weight.bfloat16().float())
    save_eagle3_head(head, tmp_path / "head")
    spec = SpeculativeConfig(method="eagle3", model=str(tmp_path / "head"), draft_quant="auto")
    pipe = load(tiny_pair[0], spec, dtype="bfloat16", warm_up=False)
    drafter = pipe.engine.drafter
    assert isinstance(drafter, Eagle3Drafter) and drafter.head.dtype == torch.float32 and drafter.head.lean is not None
    assert isinstance(drafter.head.fc, wide_linear.Bf16ProductLinear) is not emulated  # fc: weights of bf16 numbers
    plain = pipe.with_speculative("none")
    for prompt in PROMPTS:
        assert pipe.engine.generate(prompt, greedy_params(16)).tokens == plain.engine.generate(prompt, greedy_params(16)).tokens
    # fc (bf16 numbers, a multiple of 16 outputs here) runs in the column kernel: PyTorch's product up to rounding,
    # of bf16-rounded inputs where it multiplies on AMX tiles (a bf16 model's products)
    head = drafter.head
    assert head.lean.fc is not None
    features = torch.randn(5, head.fc.in_features)
    amx = head.lean.fc[1] == BF16A
    assert amx is (not emulated and amx_products())
    with torch.inference_mode():
        expected = F.linear(features.bfloat16().float(), head.fc.weight) if amx else head.fc(features)
        torch.testing.assert_close(head.fuse(features), expected, rtol=1e-5, atol=1e-5)


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, monkeypatch):
    for flags, native in (("fpu avx2 fma", False), ("fpu avx2 avx512f avx512_bf16", True), ("fpu amx_bf16", True)):
        info = tmp_path / "cpuinfo"
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(wide_linear, "Path", lambda _: info)
        assert wide_linear.native_bf16.__wrapped__() is native


def test_a_batch_over_bf16_weights_decodes_each_request_as_alone(tiny_pair, monkeypatch):
    """Batched passes over such a target run a lean pass per request (faster than one fp32 PyTorch pass over all):
    each request's greedy output is its output alone."""
    bf16_emulated(monkeypatch)
    pipe = load(tiny_pair[0], SpeculativeConfig(gamma=3), dtype="bfloat16", warm_up=False)
    params = greedy_params(12)
    alone = [pipe.engine.generate(p, params).tokens for p in PROMPTS]
    batch = pipe.batch_engine(max_batch=4)
    got = [[] for _ in PROMPTS]
    for i, prompt in enumerate(PROMPTS):
        batch.submit(prompt, params, lambda c, i=i: got[i].extend(c.tokens), lambda e: pytest.fail(str(e)))
    batch.run()
    assert got == alone


def test_foretell_cost_times_the_target_as_load_runs_it(tiny_pair, tmp_path, monkeypatch, capsys):
    from foretell.cli import main

    monkeypatch.setenv("FORETELL_CACHE", str(tmp_path / "cache"))
    bf16_emulated(monkeypatch)
    assert main(["cost", str(tiny_pair[0]), "--dtype", "bfloat16", "--plot", str(tmp_path / "c.png")]) == 0
    assert "(lean step, bf16 weights, float32 activations)" in capsys.readouterr().out
    assert main(["cost", str(tiny_pair[0]), "--dtype", "float32", "--plot", str(tmp_path / "d.png")]) == 0
    out = capsys.readouterr().out
    assert "(lean step)" in out and "bf16 weights" not in out


@pytest.mark.parametrize("emulated", [True, False])
def test_each_node_of_a_wide_tree_computes_its_path_decoded_alone(tiny_pair, monkeypatch, emulated):
    """A verification tree of 70 nodes (more than one lean call takes: in chunks; attention takes its queries three at a time where the CPU has AVX-512, and
    each node sees the context and its ancestors only): every node's logits bit for bit what one-token steps along
    its path compute."""
    bf16_emulated(monkeypatch, emulated)
    model = load(tiny_pair[0], "none", dtype="bfloat16", warm_up=False).target.model
    g = torch.Generator().manual_seed(3)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) if i > 1 else 0 for i in range(1, 70)]
    parents[1] = -1  # two roots: siblings at depth 0
    tokens = torch.randint(0, model.config.vocab_size, (70,), generator=g)
    paths = []
    for node in range(70):
        path, at = [], node
        while at >= 0:
            path.insert(0, at)
            at = parents[at]
        paths.append(path)
    mask = torch.zeros(70, 70, dtype=torch.bool)
    for node, path in enumerate(paths):
        mask[node, path] = True
    context = torch.tensor([1, 5, 9, 12, 5, 9, 30, 7, 7, 3, 4])
    cache = model.new_cache(96)
    model(context, torch.arange(len(context)), cache)
    cache.commit_prefix(len(context))
    depth = torch.tensor([len(p) - 1 for p in paths])
    tree = model(tokens, len(context) + depth, cache, tree_mask=mask)
    for node in (0, 1, 5, 11, 17, 23, 31, 32, 47, 64, 69):
        alone = model.new_cache(96)
        model(context, torch.arange(len(context)), alone)
        alone.commit_prefix(len(context))
        for i, at in enumerate(paths[node]):
            step = model(tokens[at:at + 1], torch.tensor([len(context) + i]), alone)
            alone.commit_prefix(1)
        assert torch.equal(step.logits[0], tree.logits[node]), node


def test_a_head_saved_in_float32_drafts_over_bf16_numbers_on_a_bf16_target(tiny_pair, tmp_path, monkeypatch):
    """A head a training run saved in float32 holds values that are not bf16 numbers; loaded for a bf16 target (run
    as float32 activations) its parameters are rounded to bf16 numbers, as on a bf16 target, so its layers and fuse
    stream as bf16 like a shipped head's (not the float32 kinds, about twice the draft time on an AVX2 CPU), and it
    still reproduces plain decoding. For a float32 target its weights stay as saved."""
    from foretell.runtime.loading import build_model
    from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head, save_parallel_head

    bf16_emulated(monkeypatch)
    target = build_model(tiny_pair[0], torch.float32)
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=2)
    folder = save_parallel_head(head, tmp_path / "head")
    assert not torch.equal(head.fuse.weight, head.fuse.weight.bfloat16().float())  # float32 values
    spec = SpeculativeConfig(method="parallel-head", model=str(folder), budget="fixed")
    pipe = load(tiny_pair[0], spec, dtype="bfloat16", warm_up=False)
    loaded = pipe.engine.drafter.head
    assert loaded.dtype == torch.float32 and loaded.lean is not None
    for name, p in loaded.named_parameters():
        assert torch.equal(p, p.bfloat16().float()), name
    assert torch.equal(loaded.fuse.weight, head.fuse.weight.bfloat16().float())
    assert set(loaded.lean.kinds) == {BF16X} and loaded.lean.input_layer is not None
    plain = pipe.with_speculative("none")
    for prompt in PROMPTS:
        params = greedy_params(16)
        assert pipe.engine.generate(prompt, params).tokens == plain.engine.generate(prompt, params).tokens
    as_saved = load(tiny_pair[0], spec, warm_up=False).engine.drafter.head  # a float32 target
    assert torch.equal(as_saved.fuse.weight, head.fuse.weight) and F32 in as_saved.lean.kinds
