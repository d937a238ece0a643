"""The lean one-token step (runtime/lean_step.py, kernels/lean_decode.cpp): the same arithmetic as the PyTorch
path in one native call. Its logits, hidden states and cache writes match PyTorch's one-token pass on dense fp32,
int4 and GGUF-block weights, and every drafter still reproduces plain decoding with it on."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, assert_drafters_reproduce_plain, greedy_params
from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.kernels import lean_decode
from foretell.runtime.gguf_quant import BlockQ8Linear
from foretell.runtime.lean_step import Q4X
from foretell.runtime.quant import Int4Linear, int4_blocks

pytestmark = pytest.mark.skipif(lean_decode() is None, reason="the lean step's kernel cannot be built on this machine")


def steps_side_by_side(model, context: list[int], tokens: list[int]):
    """Decode `tokens` one at a time after `context`, once with the lean step and once without, each in its own
    cache; yields (lean output, PyTorch output, lean cache, PyTorch cache) after each."""
    caches = {name: model.new_cache(64) for name in ("lean", "torch")}
    ids = torch.tensor(context)
    for cache in caches.values():
        model.lean = None
        model(ids, torch.arange(len(ids)), cache)
        cache.commit_prefix(len(ids))
    for token in tokens:
        outs = {}
        for name, cache in caches.items():
            model.use_lean_step(name == "lean")
            assert (model.lean is not None) == (name == "lean")
            pos = torch.tensor([cache.length])
            outs[name] = model(torch.tensor([token]), pos, cache, hidden_layers=(0, 1, len(model.layers)))
            cache.commit_prefix(1)
        yield outs["lean"], outs["torch"], caches["lean"], caches["torch"]
    model.lean = None


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_lean_step_matches_pytorch(tiny_pair, quant):
    assert_steps_match_pytorch(load(tiny_pair[0], "none", quant=quant, warm_up=False).target.model)


# Families past Llama whose layers the lean step runs, in test_families' builders with the changes that give that
# shape: Qwen2 without a sliding window (as Qwen2.5's configs), with q, k, v biases; Qwen3 without one (as its
# configs), with its norms per q / k head and biases on every attention projection; Phi-3 without a window and
# with full rotary (its fused qkv and gate_up projections)
LEAN_FAMILIES = {"qwen2-swa": ("qwen2", {"use_sliding_window": False}),
                 "qwen3": ("qwen3", {"use_sliding_window": False}),
                 "phi3": ("phi3", {"sliding_window": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})}


@pytest.fixture(scope="module", params=list(LEAN_FAMILIES))
def family_folder(request, tmp_path_factory):
    """(model type, a tiny model's folder), its biases and q / k norms (where it has them) random, not
    transformers' zeros and ones."""
    from conftest import make_tokenizer, save_model_folder
    from test_families import VOCAB, build

    model_type, changes = LEAN_FAMILIES[request.param]
    hf = build(request.param, **changes)
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.5)
        for name, weight in hf.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                weight.normal_(1, 0.3)
    return model_type, save_model_folder(tmp_path_factory.mktemp(model_type) / "target", hf, make_tokenizer(VOCAB))


@pytest.mark.parametrize("quant", ["none", "int4", "int4-q8"])
def test_qwen_and_phi3_run_the_lean_step(family_folder, quant):
    """Their steps through the lean step match PyTorch's (float activations; Qwen2's biases in the qkv product,
    Qwen3's q / k norms), and speculation reproduces plain decoding (8-bit activations too)."""
    model_type, folder = family_folder
    plain = load(folder, "none", quant=quant, warm_up=False)
    model = plain.target.model
    assert model.config.model_type == model_type and model.lean is not None
    if model_type.startswith("qwen"):
        assert model.layers[0].qkv_proj.bias.abs().max() > 0.1
    if model_type == "qwen3":
        assert (model.layers[0].q_norm.weight - 1).abs().max() > 0.1
    if not quant.endswith("-q8"):
        assert_steps_match_pytorch(model)
        model.use_lean_step()
    assert_drafters_reproduce_plain(plain, folder)


def assert_steps_match_pytorch(model) -> None:
    """One-token steps through the lean step give PyTorch's logits, hidden states and cache entries."""
    assert model.use_lean_step() is None
    for lean, ref, lean_cache, ref_cache in steps_side_by_side(model, [1, 5, 9, 12], [5, 9, 30, 7, 7]):
        assert lean.logits.shape == ref.logits.shape
        torch.testing.assert_close(lean.logits, ref.logits, rtol=1e-4, atol=1e-4)
        assert set(lean.hidden) == set(ref.hidden)
        for i in ref.hidden:
            torch.testing.assert_close(lean.hidden[i], ref.hidden[i], rtol=1e-4, atol=1e-4)
        n = ref_cache.length
        torch.testing.assert_close(lean_cache.k[:, :, :, :n], ref_cache.k[:, :, :, :n], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(lean_cache.v[:, :, :, :n], ref_cache.v[:, :, :, :n], rtol=1e-4, atol=1e-4)


def test_native_dequantization_matches_the_tensor_formula():
    from foretell.runtime.quant import dequantize_q4, dequantize_q4_torch

    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 256, (48, 64 // 2 * 3), generator=g, dtype=torch.uint8)
    dm = torch.randn(48, 6, 2, generator=g)
    torch.testing.assert_close(dequantize_q4(codes, dm), dequantize_q4_torch(codes, dm), rtol=1e-6, atol=1e-6)


def test_int4_blocks_hold_the_layers_values():
    torch.manual_seed(0)
    layer = Int4Linear.from_weight(torch.randn(32, 64))
    codes, dm = int4_blocks(layer)
    low, high = (codes & 15).view(32, 2, 16), (codes >> 4).view(32, 2, 16)
    q = torch.cat([low, high], dim=-1).float()  # [out, blocks, 32]
    w = (q * dm[..., :1] + dm[..., 1:]).view(32, 64)
    torch.testing.assert_close(w, layer.dequantized(), rtol=0, atol=1e-6)
    # the blocks a layer makes from its codes when quantized (no identity product through the int4 kernel: that
    # took minutes a layer on a 1.5B model) are exactly the recovered ones
    made_codes, made_dm = layer.blocks
    assert torch.equal(made_codes, codes) and torch.equal(made_dm, dm)


def test_q8_blocks_run_in_the_lean_step(tiny_pair):
    """An output layer carrying Q8_0 blocks of exactly its values: the lean step reads the blocks."""
    model = load(tiny_pair[0], "none", warm_up=False).target.model
    w = model.lm_head.weight.detach()
    d = (w.view(w.shape[0], -1, 32).abs().amax(-1) / 127).clamp_min(1e-8)
    codes = torch.round(w.view(w.shape[0], -1, 32) / d[..., None]).clamp(-127, 127)
    with torch.no_grad():
        model.lm_head.weight.copy_((codes * d[..., None]).view_as(w))  # the dense weight holds the blocks' values
    model.lm_head = BlockQ8Linear(model.lm_head, codes.to(torch.int8).view_as(w).contiguous(), d.contiguous())
    assert model.use_lean_step() is None and model.lean.kinds[-1] == 1
    for lean, ref, _, _ in steps_side_by_side(model, [1, 20, 21], [22, 23]):
        torch.testing.assert_close(lean.logits, ref.logits, rtol=1e-4, atol=1e-4)


def test_lean_step_says_why_not(tiny_pair):
    model = load(tiny_pair[0], "none", dtype="bfloat16", lean=False, warm_up=False).target.model  # stays bf16
    assert "float32" in model.use_lean_step() and model.lean is None
    model = load(tiny_pair[0], "none", warm_up=False).target.model
    model.layers[0].o_proj = torch.nn.Sequential(model.layers[0].o_proj)
    assert "Sequential" in model.use_lean_step() and model.lean is None


def test_every_drafter_reproduces_plain_decoding_with_the_lean_step(tiny_pair):
    plain = load(tiny_pair[0], "none", quant="int4", warm_up=False)
    expected = [plain.engine.generate(p, greedy_params()).tokens for p in PROMPTS]
    assert plain.target.model.use_lean_step() is None
    for spec in (SpeculativeConfig(method="none"), SpeculativeConfig(gamma=3),
                 SpeculativeConfig(method="draft-model", model=str(tiny_pair[1]), gamma=3),
                 SpeculativeConfig(method="draft-tree", model=str(tiny_pair[1]))):
        pipe = plain.with_speculative(spec)
        assert pipe.target.model.lean is not None
        for prompt, want in zip(PROMPTS, expected):
            assert pipe.engine.generate(prompt, greedy_params()).tokens == want, spec.method


def q8_activations(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x rounded as the kernel's 8-bit activations are: per `block` values (32; K-quant weights: 256), 127 steps of
    max |x| / 127."""
    blocks = x.view(x.shape[0], -1, block)
    top = blocks.abs().amax(-1, keepdim=True)
    codes = torch.round(blocks * torch.where(top > 0, 127 / top, 0))
    return (codes * (top / 127)).view_as(x)


@pytest.mark.parametrize(("kind", "act_q8", "layout"), [(kind, act_q8, layout) for kind in (0, 1) for act_q8, layout in
                                                        ((False, "rows"), (True, "rows"), (True, "interleaved"))])
def test_block_products_match_dense_and_the_one_row_sums(kind, act_q8, layout):
    """Q4 (kind 0) and Q8 (kind 1) blocks times 1..19 rows: the dense product of the blocks' values (of the
    activations rounded to 8 bits with act_q8), and each row exactly what that row alone gives (a verification pass
    computes a one-token step's sums). With 8-bit activations also in the column-interleaved layout."""
    from foretell.kernels import block_gemm
    from foretell.runtime.lean_step import Q8X, interleaved
    from foretell.runtime.quant import dequantize_q4

    g = torch.Generator().manual_seed(kind)
    out, cols = 40, 96
    if kind == 0:
        codes = torch.randint(0, 256, (out, cols // 2), generator=g, dtype=torch.uint8)
        scales = torch.rand(out, cols // 32, 2, generator=g) - 0.5
        w = dequantize_q4(codes, scales)
    else:
        codes = torch.randint(-127, 128, (out, cols), generator=g, dtype=torch.int8)
        scales = torch.rand(out, cols // 32, generator=g)
        w = (codes.float().view(out, -1, 32) * scales[..., None]).view(out, cols)
    gemm = block_gemm()
    if layout == "interleaved":
        packed, codes, scales = interleaved(kind, codes, scales)
        assert packed == (Q4X, Q8X)[kind] and codes.shape[:2] == (out // 8, cols // 32)
        kind = packed
    x = torch.randn(19, cols, generator=g)
    want = (q8_activations(x) if act_q8 else x) @ w.T
    for rows in range(1, 20):  # up to three passes of 8 (VNNI) or five of 4
        y = gemm(x[:rows], kind, codes, scales, act_q8)
        torch.testing.assert_close(y, want[:rows], rtol=1e-5, atol=1e-4)
        assert all(torch.equal(y[r], gemm(x[r:r + 1], kind, codes, scales, act_q8)[0]) for r in range(rows))
    if act_q8:  # the rounding is real: float activations give other sums
        assert (gemm(x, kind, codes, scales, act_q8) - x @ w.T).abs().max() > 1e-3


@pytest.mark.parametrize("kind", [0, 1], ids=["Q4X", "Q8X"])
def test_interleaved_blocks_on_vnni_give_avx2s_bits(kind):
    """Q4X / Q8X with 8-bit activations, 1..19 rows: AVX-512 VNNI's dot products (passes of 8) and AVX2's (passes
    of 4) give the same bits, so a machine's verification passes and one-token steps agree whichever it takes."""
    from foretell.kernels import block_gemm, lean_module
    from foretell.runtime.lean_step import interleaved

    module = lean_module()
    if not module.lean_vnni(True):
        pytest.skip("this CPU has no AVX-512 VNNI")
    g = torch.Generator().manual_seed(11)
    out, cols = 48, 128
    if kind == 0:
        codes = torch.randint(0, 256, (out, cols // 2), generator=g, dtype=torch.uint8)
        scales = torch.rand(out, cols // 32, 2, generator=g) - 0.5
    else:
        codes = torch.randint(-128, 128, (out, cols), generator=g, dtype=torch.int8)  # -128: |w| = 128 unsigned
        scales = torch.rand(out, cols // 32, generator=g)
    packed, codes, scales = interleaved(kind, codes, scales)
    x = torch.randn(19, cols, generator=g) * 4
    gemm = block_gemm()
    try:
        for rows in range(1, 20):
            fast = gemm(x[:rows], packed, codes, scales, True)
            module.lean_vnni(False)
            plain = gemm(x[:rows], packed, codes, scales, True)
            module.lean_vnni(True)
            assert torch.equal(fast, plain), rows
    finally:
        module.lean_vnni(True)


@pytest.mark.parametrize("cols", [96, 44])
def test_int8_columns_match_dense_and_the_one_row_sums(cols):
    """An int8 layer with a scale per output row (a drafter's Int8Linear) as I8X, 16 output columns interleaved,
    times 1..13 rows (one to three passes), also for an input count that is no multiple of 8: the dense product of
    its values, each row what it gives alone; Int8Linear's own product on CPU is that kernel's."""
    from foretell.kernels import block_gemm
    from foretell.runtime.lean_step import I8X, packed_projection
    from foretell.runtime.quant import Int8Linear

    g = torch.Generator().manual_seed(cols)
    layer = Int8Linear.from_weight(torch.randn(48, cols, generator=g))
    w = layer.weight_int8.double() * layer.scale.double()[:, None]
    x = torch.randn(13, cols, generator=g)
    kind, codes, scales, _ = packed_projection(layer, interleave=False)
    assert kind == I8X and codes.shape == (3, cols, 16) and torch.equal(codes[1, :, 5], layer.weight_int8[21])
    gemm = block_gemm()
    for rows in range(1, 14):
        y = gemm(x[:rows], kind, codes, scales)
        torch.testing.assert_close(y.double(), x[:rows].double() @ w.T, rtol=1e-5, atol=1e-4)
        assert all(torch.equal(y[r], gemm(x[r:r + 1], kind, codes, scales)[0]) for r in range(rows))
    assert torch.equal(layer(x[:4]), gemm(x[:4], kind, codes, scales))
    if cols % 32 == 0:  # 8-bit activations keep their blocks
        assert packed_projection(layer, interleave=True)[0] != I8X


def test_a_gguf_target_streams_its_q8_0_output_layer(tmp_path):
    """A GGUF with Q4_1 projections and a Q8_0 output layer (SmolLM2's file): the output layer keeps its blocks,
    the lean step reads them, and speculation reproduces the lean plain decoding."""
    pytest.importorskip("gguf")
    from conftest import make_hf_model
    from test_families_gguf import write_gguf

    hf = make_hf_model("llama", 48, seed=5)
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    path = write_gguf(hf, "llama", tmp_path / "tiny-q4_1.gguf",
                      q4_1=lambda name: name.endswith(tuple(f"{p}.weight" for p in projections)),
                      q8_0=lambda name: name == "lm_head.weight")
    plain = load(path, "none", quant="gguf", warm_up=False, cache_dir=tmp_path)
    model = plain.target.model
    assert isinstance(model.lm_head, BlockQ8Linear)
    values = (model.lm_head.codes.float().view(48, -1, 32) * model.lm_head.scales[..., None]).view(48, -1)
    assert torch.equal(values, model.lm_head.weight.float())  # the blocks hold the dense layer's values
    assert model.use_lean_step() is None and model.lean.kinds[-1] == 1 and model.lean.kinds[0] == 0
    expected = [plain.engine.generate(p, greedy_params()).tokens for p in PROMPTS]
    for spec in (SpeculativeConfig(gamma=3), SpeculativeConfig(method="draft-tree", model=str(path))):
        pipe = plain.with_speculative(spec)
        for prompt, want in zip(PROMPTS, expected):
            assert pipe.engine.generate(prompt, greedy_params()).tokens == want, spec.method


def test_a_tree_pass_matches_pytorch_and_each_row_alone(tiny_pair):
    """A verification pass with a tree mask: PyTorch's logits up to rounding, and each row bit for bit what a
    one-token step on its own path computes."""
    model = load(tiny_pair[0], "none", quant="int4", warm_up=False).target.model
    assert model.use_lean_step() is None
    step = model.lean
    context = torch.tensor([1, 5, 9, 12, 5])
    # a tree of 4 nodes after the context: 0 -> 1 -> 3, 0 -> 2
    parents = [-1, 0, 0, 1]
    tokens, depth = torch.tensor([9, 30, 7, 12]), torch.tensor([0, 1, 1, 2])
    mask = torch.eye(4, dtype=torch.bool)
    for node, parent in enumerate(parents):
        while parent >= 0:
            mask[node, parent] = True
            parent = parents[parent]
    outs, caches = {}, {}
    for name in ("lean", "torch"):
        model.lean = None
        cache = caches[name] = model.new_cache(32)
        model(context, torch.arange(5), cache)
        cache.commit_prefix(5)
        model.lean = step if name == "lean" else None
        outs[name] = model(tokens, 5 + depth, cache, tree_mask=mask)
    torch.testing.assert_close(outs["lean"].logits, outs["torch"].logits, rtol=1e-4, atol=1e-4)
    # node 3's path (0, 1, 3) decoded one token at a time from the same context
    model.lean = step
    cache = caches["lean"]
    cache.commit_slots(torch.tensor([0, 1]))
    alone = model(tokens[3:], torch.tensor([7]), cache)
    assert torch.equal(alone.logits[0], outs["lean"].logits[3])
    model.lean = None


def test_8_bit_activations_are_one_model_whatever_the_pass_width(tiny_pair):
    """quant="int4-q8": a 40-token prompt in one pass (two chunks of the lean step) computes bit for bit what 40
    one-token steps compute, and differs from float activations (the rounding is real)."""
    pipe = load(tiny_pair[0], "none", quant="int4-q8", warm_up=False)
    model = pipe.target.model
    assert model.lean is not None and model.lean.act_q8
    assert Q4X in model.lean.kinds  # the int4 projections read 8 output columns at a time
    ids = torch.tensor([(7 * i + 3) % 48 for i in range(40)])
    whole = model(ids, torch.arange(40), model.new_cache(48), hidden_layers=(1,))
    cache = model.new_cache(48)
    for i in range(40):
        step = model(ids[i:i + 1], torch.tensor([i]), cache, hidden_layers=(1,))
        cache.commit_prefix(1)
        assert torch.equal(step.logits[0], whole.logits[i]) and torch.equal(step.hidden[1][0], whole.hidden[1][i])
    model.lean.act_q8 = False
    floats = model(ids, torch.arange(40), model.new_cache(48)).logits
    assert not torch.allclose(floats, whole.logits, rtol=0, atol=1e-5)
    assert (floats - whole.logits).abs().mean() < 0.1 * whole.logits.std()  # close: rounding, not another net


def test_a_prompt_projects_only_the_rows_it_asks_logits_for(tiny_pair):
    """A 40-token prompt (two chunks of the lean step) asking for its last row's logits, or none, runs its first
    chunk without the output layer and gets the same numbers, hidden states and cache as the pass with every row's
    logits."""
    from foretell.runtime import lean_step

    pipe = load(tiny_pair[0], "none", quant="int4-q8", warm_up=False)
    model = pipe.target.model
    ids = torch.tensor([(5 * i + 1) % 48 for i in range(40)])
    full_cache = model.new_cache(48)
    whole = model(ids, torch.arange(40), full_cache, hidden_layers=(1, len(model.layers)))
    heads_used = []
    kernel = model.lean.kernel
    model.lean.kernel = lambda *args: heads_used.append(len(args[8])) or kernel(*args)
    try:
        for rows, expected in ((slice(-1, None), whole.logits[-1:]), (slice(0, 0), whole.logits[:0]),
                               (torch.tensor([35, 39]), whole.logits[[35, 39]])):
            heads_used.clear()
            cache = model.new_cache(48)
            out = model(ids, torch.arange(40), cache, hidden_layers=(1, len(model.layers)), logits_rows=rows)
            assert torch.equal(out.logits, expected)
            assert all(torch.equal(out.hidden[i], whole.hidden[i]) for i in out.hidden)
            assert torch.equal(cache.k[:, :, :, :40], full_cache.k[:, :, :, :40])
            assert heads_used == [1, len(model.lean.head)]  # the first chunk: the final norm alone
    finally:
        model.lean.kernel = kernel
    assert lean_step.skip_logits(40, 32, 39) == 32 and lean_step.skip_logits(40, 32, 40) == 32
    assert lean_step.skip_logits(20, 32, 19) == 0 and lean_step.skip_logits(64, 32, 10) == 0


def test_fetching_weights_ahead_leaves_the_products_bits():
    """The interleaved products fetch later groups' weights while they multiply (lean_prefetch): the same bits as
    without, for 1..17 rows of Q4X and Q8X blocks."""
    from foretell.kernels import block_gemm, lean_module
    from foretell.runtime.lean_step import interleaved

    module = lean_module()
    g = torch.Generator().manual_seed(5)
    out, cols = 96, 128
    blocks = {0: (torch.randint(0, 256, (out, cols // 2), generator=g, dtype=torch.uint8),
                  torch.rand(out, cols // 32, 2, generator=g) - 0.5),
              1: (torch.randint(-128, 128, (out, cols), generator=g, dtype=torch.int8),
                  torch.rand(out, cols // 32, generator=g))}
    x = torch.randn(17, cols, generator=g)
    try:
        for kind, (codes, scales) in blocks.items():
            packed = interleaved(kind, codes, scales)
            for rows in (1, 8, 17):
                module.lean_prefetch(2)
                ahead = block_gemm()(x[:rows], *packed, True)
                module.lean_prefetch(0)
                assert torch.equal(ahead, block_gemm()(x[:rows], *packed, True))
    finally:
        module.lean_prefetch(2)


def test_every_drafter_reproduces_plain_decoding_with_8_bit_activations(tiny_pair):
    assert_drafters_reproduce_plain(load(tiny_pair[0], "none", quant="int4-q8", warm_up=False), tiny_pair[1])


def test_8_bit_activations_need_the_lean_step(tiny_pair):
    from foretell.errors import ForetellError

    with pytest.raises(ForetellError, match="float32 target on CPU"):
        load(tiny_pair[0], "none", dtype="bfloat16", quant="int4-q8", warm_up=False)
    with pytest.raises(ForetellError, match="lean=True"):
        load(tiny_pair[0], "none", quant="gguf-q8", lean=False, warm_up=False)
    with pytest.raises(ForetellError, match="unknown target quantization 'none-q8'"):
        load(tiny_pair[0], "none", quant="none-q8", warm_up=False)


@pytest.mark.parametrize("int8", [False, True])
def test_column_products_on_avx512_give_avx2s_bits(int8):
    """BF16X and I8X products of 1..35 rows (up to three passes of 16 on AVX-512, six of 6 on AVX2): the same bits
    on both paths, so a machine's verification passes and one-token steps agree whichever it takes."""
    from foretell.kernels import block_gemm, lean_module
    from foretell.runtime.lean_step import bf16_interleaved, packed_projection
    from foretell.runtime.quant import Int8Linear

    module = lean_module()
    if not module.lean_avx512(True):
        pytest.skip("this CPU has no AVX-512")
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(96, 200, generator=g)
    if int8:
        kind, main, scales, _ = packed_projection(Int8Linear.from_weight(weight), interleave=False)
    else:
        (kind, main), scales = bf16_interleaved(weight.bfloat16()), torch.empty(0)
    x = torch.randn(35, 200, generator=g)
    gemm = block_gemm()
    try:
        for rows in range(1, 36):
            wide = gemm(x[:rows], kind, main, scales)
            module.lean_avx512(False)
            narrow = gemm(x[:rows], kind, main, scales)
            module.lean_avx512(True)
            assert torch.equal(wide, narrow), rows
    finally:
        module.lean_avx512(True)
