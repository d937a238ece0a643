"""A GGUF target runs the blocks its file ships (quant="gguf"): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q4_K,
Q5_K, Q6_K, in the lean step's GGUF kind (kernels/lean_decode.cpp). The kernel's weights are the reference
dequantization's (gguf.quants.dequantize) bit for bit; its products match the dense product of those weights
(float activations: up to summation order; 8-bit activations: of the activations rounded as the kernel rounds
them), and each row is what it would be alone; a tiny model of each block type gives the dense model's logits, and
speculation reproduces its plain greedy decoding; a block type foretell does not run is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import PROMPTS, assert_drafters_reproduce_plain, greedy_params
from foretell.api import load
from foretell.errors import ForetellError
from foretell.kernels import block_gemm, lean_module
from foretell.layer_rows import select_rows
from foretell.runtime.gguf_quant import GGUF_KIND, BlockQ8Linear, GGUFLinear
from foretell.runtime.quant import Int4Linear
from gguf_blocks import T, quantize
from test_lean_step import q8_activations

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(lean_module() is None, reason="the lean kernels cannot be built on this machine")

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
# The tiny models: inputs of every projection a multiple of 256 (K-quant blocks), vocabulary 48 (conftest's prompts)
DIMS = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=2, initializer_range=0.05)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def blocks_of(kind, rows: int = 24, cols: int = 512, seed: int = 0) -> tuple[np.ndarray, torch.Tensor]:
    """A random weight [rows, cols] as blocks of `kind`: (the bytes [rows, row bytes], their reference weight)."""
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    raw = quantize(w, kind)
    reference = torch.from_numpy(gguf.quants.dequantize(raw, kind).reshape(rows, cols).astype(np.float32))
    # the test's quantizers are quantizers: the blocks stand for w, to within their steps
    assert (reference - torch.from_numpy(w)).abs().max() < 0.1 * np.abs(w).max()
    return raw, reference


def layer_of(parts: list[tuple[int, np.ndarray]], bias: torch.Tensor | None = None) -> GGUFLinear:
    return GGUFLinear([(int(kind), torch.from_numpy(raw)) for kind, raw in parts], bias)


@pytest.mark.parametrize("kind", TYPES, ids=lambda k: k.name)
def test_the_kernels_weights_are_the_reference_dequantization(kind):
    """Bit for bit: each type's scales times codes in fp32 (a K-quant's d * s has at most 11 + 8 significant bits
    and its codes 6, so the products the kernel fuses with the minimum are exact, as the reference's are)."""
    raw, reference = blocks_of(kind)
    layer = layer_of([(kind, raw)])
    assert (layer.out_features, layer.in_features) == (24, 512)
    assert torch.equal(layer.dequantized(), reference)


@pytest.mark.parametrize("act_q8", [False, True], ids=["float", "8-bit"])
@pytest.mark.parametrize("kind", TYPES, ids=lambda k: k.name)
def test_block_products_match_dense_and_each_row_alone(kind, act_q8):
    """1..17 rows: the dense product of the reference weights (of the activations rounded to 8 bits with act_q8),
    and each row bit for bit what it gives alone (a verification pass computes a one-token step's numbers)."""
    raw, reference = blocks_of(kind, seed=int(kind))
    layer = layer_of([(kind, raw)])
    gemm = block_gemm()
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(1))
    block = 256 if kind in (T.Q4_K, T.Q5_K, T.Q6_K) else 32  # K-quants: the activations as llama.cpp's Q8_K
    want = (q8_activations(x, block) if act_q8 else x) @ reference.T
    for rows in range(1, 18):  # K-quants: passes of 8 rows, then the rest
        y = gemm(x[:rows], GGUF_KIND, layer.raw, layer.layout, act_q8)
        torch.testing.assert_close(y, want[:rows], rtol=1e-5, atol=1e-4)
        assert all(torch.equal(y[r], gemm(x[r:r + 1], GGUF_KIND, layer.raw, layer.layout, act_q8)[0])
                   for r in range(rows))
    if act_q8:  # the rounding is real: float activations give other sums
        assert (gemm(x, GGUF_KIND, layer.raw, layer.layout, act_q8) - x @ reference.T).abs().max() > 1e-3



@pytest.mark.parametrize("kind", [T.Q4_K, T.Q6_K], ids=lambda k: k.name)
def test_k_quant_interleaved_records_match_dense_and_each_row_alone(kind):
    """A Q4_K or Q6_K projection as KQ4X / KQ6X records (8 columns interleaved, with 8-bit activations): the dense
    product of the reference weights with the activations rounded per 256 (Q8_K), each of 1..19 rows bit for bit
    what it gives alone, and AVX-512 VNNI's dot products (where the CPU has them) the same bits as AVX2's."""
    from foretell.runtime.lean_step import KQ4X, KQ6X, gguf_records

    raw, reference = blocks_of(kind, rows=40, seed=3)
    layer = layer_of([(kind, raw)])
    packed, records, scales = gguf_records(layer.raw, layer.layout)
    assert packed == (KQ4X if kind == T.Q4_K else KQ6X) and records.shape == (5, 2, 1184 if kind == T.Q4_K else 1680)
    gemm = block_gemm()
    x = torch.randn(19, 512, generator=torch.Generator().manual_seed(4))
    want = q8_activations(x, 256) @ reference.T
    for rows in range(1, 20):
        y = gemm(x[:rows], packed, records, scales, True)
        torch.testing.assert_close(y, want[:rows], rtol=1e-5, atol=1e-4)
        assert all(torch.equal(y[r], gemm(x[r:r + 1], packed, records, scales, True)[0]) for r in range(rows))
    module = lean_module()
    if module.lean_vnni(True):
        try:
            fast = gemm(x, packed, records, scales, True)
            module.lean_vnni(False)
            assert torch.equal(fast, gemm(x, packed, records, scales, True))
        finally:
            module.lean_vnni(True)
    if kind == T.Q6_K:
        return
    mixed = layer_of([(T.Q4_K, raw), (T.Q6_K, blocks_of(T.Q6_K, rows=8)[0])])
    assert gguf_records(mixed.raw, mixed.layout)[0] not in (KQ4X, KQ6X)  # two types: the GGUF kind's rows


@pytest.mark.parametrize("kinds", [(T.Q4_0,), (T.Q5_0,), (T.Q8_0,), (T.Q5_0, T.Q8_0), (T.Q4_0, T.Q5_0)],
                         ids=lambda ks: "+".join(k.name for k in ks))
def test_small_blocks_as_interleaved_records(kinds):
    """Q4_0, Q5_0 and Q8_0 projections (a Qwen2.5-0.5B file's: q, k in Q5_0, v in Q8_0) in the column-interleaved
    kinds: Q4X for Q4_0 alone (its codes are Q4_1's, m = -8 d), else Q8X (every part w = d * code); the same
    weights (the records' product is the dense product of the reference weights, with the activations rounded per
    32 inputs), and each row bit for bit what it gives alone."""
    from foretell.runtime.lean_step import Q4X, Q8X, gguf_records

    parts = [blocks_of(kind, rows=16, seed=5 + i) for i, kind in enumerate(kinds)]
    layer = layer_of([(kind, raw) for kind, (raw, _) in zip(kinds, parts)])
    reference = torch.cat([ref for _, ref in parts])
    packed, codes, scales = gguf_records(layer.raw, layer.layout)
    assert packed == (Q4X if kinds == (T.Q4_0,) else Q8X)
    gemm = block_gemm()
    x = torch.randn(11, 512, generator=torch.Generator().manual_seed(6))
    want = q8_activations(x, 32) @ reference.T
    y = gemm(x, packed, codes, scales, True)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-4)
    assert all(torch.equal(y[r], gemm(x[r:r + 1], packed, codes, scales, True)[0]) for r in range(11))

def test_a_projection_of_mixed_parts():
    """A fused projection whose parts differ in type (a Q4_K_M file's q, k: Q4_K, v: Q6_K): each part's rows are
    its own product, the bias added, in the layer's PyTorch forward too (bf16 activations: in fp32, then rounded);
    a selection of rows (a hot vocabulary) keeps the rows' own blocks."""
    parts = [blocks_of(T.Q4_K, rows=16, seed=1), blocks_of(T.Q6_K, rows=8, seed=2), blocks_of(T.Q8_0, rows=8, seed=3)]
    bias = torch.randn(32)
    layer = layer_of([(kind, raw) for kind, (raw, _) in zip((T.Q4_K, T.Q6_K, T.Q8_0), parts)], bias)
    weight = torch.cat([reference for _, reference in parts])
    assert torch.equal(layer.dequantized(), weight) and layer.layout.tolist() == [512, 12, 16, 14, 8, 8, 8]
    x = torch.randn(5, 512)
    for act_q8 in (False, True):
        whole = block_gemm()(x, GGUF_KIND, layer.raw, layer.layout, act_q8)
        alone = []
        for kind, (raw, _) in zip((T.Q4_K, T.Q6_K, T.Q8_0), parts):
            part = layer_of([(kind, raw)])
            alone.append(block_gemm()(x, GGUF_KIND, part.raw, part.layout, act_q8))
        assert torch.equal(whole, torch.cat(alone, dim=1))
    torch.testing.assert_close(layer(x), x @ weight.T + bias, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(layer(x.repeat(8, 1)), (x @ weight.T + bias).repeat(8, 1), rtol=1e-5, atol=1e-4)
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    rows = torch.tensor([30, 2, 3, 17, 16])  # from the Q8_0, Q4_K, Q4_K, Q6_K and Q6_K parts
    picked = select_rows(layer, rows)
    assert isinstance(picked, GGUFLinear) and [kind for kind, _ in picked.parts()] == [8, 12, 14]
    assert torch.equal(picked.dequantized(), weight[rows]) and torch.equal(picked.bias, bias[rows])


def tiny_gguf(path, kinds, arch: str = "qwen2"):
    """A tiny model of `arch` (qwen2: q, k, v biases; llama: q / k rows permuted in the file) written as GGUF, the
    tensors named by kinds(hf_name) as those blocks (the embedding's too, which loads dequantized), the rest F32."""
    from test_families import build
    from test_families_gguf import write_gguf

    hf = build("qwen2-swa", use_sliding_window=False, **DIMS) if arch == "qwen2" else \
        build("mistral-swa", sliding_window=None, **DIMS)  # written as llama: no window
    return write_gguf(hf, arch, path, blocks=kinds)


def projection_kind(kind):
    return lambda name: kind if name.endswith(tuple(f"{p}.weight" for p in PROJECTIONS)) or name in (
        "lm_head.weight", "model.embed_tokens.weight") else None


def prompt_and_steps(model) -> torch.Tensor:
    """Logits of a 40-token prompt, then of 4 one-token steps."""
    ids = torch.tensor([(7 * i + 3) % 48 for i in range(44)])
    cache = model.new_cache(64)
    logits = [model(ids[:40], torch.arange(40), cache).logits]
    cache.commit_prefix(40)
    for i in range(40, 44):
        logits.append(model(ids[i:i + 1], torch.tensor([i]), cache).logits)
        cache.commit_prefix(1)
    return torch.cat(logits)


def assert_logits_match_the_dense_model(kept, dense):
    """The kept blocks' logits (the prompt through PyTorch's path on the dequantized blocks; the steps through the
    lean step, then through PyTorch's few-row products on the blocks) against the same file loaded dense."""
    lean = kept.lean
    assert lean is not None
    with_lean = prompt_and_steps(kept)
    kept.lean = None
    without = prompt_and_steps(kept)
    kept.lean = lean
    want = prompt_and_steps(dense)
    for out in (with_lean, without):
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tmp_path_factory.mktemp("kquants")


@pytest.mark.parametrize("kind", TYPES, ids=lambda k: k.name)
def test_a_tiny_model_of_each_block_type(kind, files):
    """Every projection and the output layer in one type: the file's blocks are kept (Q4_1 projections in the int4
    layout, a Q8_0 output layer as BlockQ8Linear), the lean step runs them, the logits are the dense model's up to
    summation order, and prompt lookup and a draft model reproduce plain greedy decoding."""
    path = tiny_gguf(files / f"tiny-{kind.name}.gguf", projection_kind(kind))
    dense = load(path, "none", warm_up=False, cache_dir=files).target.model
    plain = load(path, "none", quant="gguf", warm_up=False, cache_dir=files)
    kept = plain.target.model
    expected = Int4Linear if kind == T.Q4_1 else GGUFLinear
    assert all(isinstance(getattr(layer, name), expected) for layer in kept.layers
               for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    assert isinstance(kept.lm_head, BlockQ8Linear if kind == T.Q8_0 else GGUFLinear)
    assert kept.lean is not None and GGUF_KIND in kept.lean.kinds
    assert_logits_match_the_dense_model(kept, dense)
    assert_drafters_reproduce_plain(plain, path)



@pytest.fixture(scope="module")
def q4_k_m(files):
    """A file laid out as llama.cpp's Q4_K_M: q, k, o, gate, up in Q4_K; v, down and the output layer in Q6_K; on
    the llama architecture, whose q / k rows the file permutes."""
    def kinds(name):
        if name.endswith(("v_proj.weight", "down_proj.weight")) or name == "lm_head.weight":
            return T.Q6_K
        return T.Q4_K if name.endswith(".weight") and "norm" not in name else None
    return tiny_gguf(files / "tiny-q4_k_m.gguf", kinds, arch="llama")


@pytest.mark.parametrize("quant", ["gguf", "gguf-q8"])
def test_a_q4_k_m_file_runs_its_blocks(q4_k_m, files, quant):
    """q, k, v in one native product of two types; float activations: the dense model's logits; both: speculation
    (prompt lookup, a draft model, a draft tree) reproduces plain greedy decoding of the same quantized model."""
    plain = load(q4_k_m, "none", quant=quant, warm_up=False, cache_dir=files)
    kept = plain.target.model
    qkv = kept.layers[0].qkv_proj
    assert isinstance(qkv, GGUFLinear) and [kind for kind, _ in qkv.parts()] == [12, 12, 14]
    assert kept.lean is not None and kept.lean.act_q8 == (quant == "gguf-q8")
    if quant == "gguf":
        assert_logits_match_the_dense_model(kept, load(q4_k_m, "none", warm_up=False, cache_dir=files).target.model)
    assert_drafters_reproduce_plain(plain, q4_k_m)


@pytest.mark.parametrize("draft_quant", ["gguf", "gguf-q8"])
def test_a_draft_model_runs_its_own_gguf_blocks(q4_k_m, files, draft_quant):
    """--draft-quant gguf / gguf-q8: the draft model keeps its file's blocks and steps in the lean step (as the
    0.5B Qwen draft runs beside its 1.5B target); draft-model and draft-tree reproduce plain greedy decoding and
    have drafts accepted. Other drafters, a draft without a GGUF file and a bf16 draft are refused by name."""
    from foretell.config import SpeculativeConfig

    plain = load(q4_k_m, "none", quant="gguf-q8", warm_up=False, cache_dir=files)
    expected = [plain.engine.generate(p, greedy_params()).tokens for p in PROMPTS]
    for method in ("draft-model", "draft-tree"):
        pipe = plain.with_speculative(SpeculativeConfig(method=method, model=str(q4_k_m), draft_quant=draft_quant))
        draft = pipe.weights.draft_model(str(q4_k_m), draft_quant).model
        assert draft.lean is not None and draft.lean.act_q8 == (draft_quant == "gguf-q8")
        assert isinstance(draft.layers[0].qkv_proj, GGUFLinear)
        results = [pipe.engine.generate(p, greedy_params()) for p in PROMPTS]
        assert [r.tokens for r in results] == expected, method
        assert sum(r.stats.accepted_tokens for r in results) > 0
    with pytest.raises(ForetellError, match="applies to draft-model and draft-tree, not eagle3"):
        SpeculativeConfig(method="eagle3", draft_quant=draft_quant)
    folder = next((files / "gguf").glob(f"{q4_k_m.stem}-*"))  # the file converted to a folder: no blocks
    with pytest.raises(ForetellError, match="has no GGUF file on disk"):
        plain.with_speculative(SpeculativeConfig(method="draft-model", model=str(folder), draft_quant=draft_quant))
    bf16 = load(q4_k_m, "none", dtype="bfloat16", lean=False, warm_up=False, cache_dir=files)  # drafters in bf16
    with pytest.raises(ForetellError, match="a float32 CPU model, not bfloat16"):
        bf16.with_speculative(SpeculativeConfig(method="draft-model", model=str(q4_k_m), draft_quant=draft_quant))


def test_a_gguf_draft_models_hot_vocabulary_runs_in_the_lean_step(files):
    """A draft model on its Q8_0 blocks with a hot vocabulary: the lean step runs its layers and only the hot rows of
    its output layer (the rows' own blocks, column-interleaved), whose logits are the full output layer's at those
    rows (-inf elsewhere); speculation still reproduces plain greedy decoding."""
    from foretell.config import SpeculativeConfig
    from foretell.runtime.lean_step import Q8X

    path = tiny_gguf(files / "tiny-draft-Q8_0.gguf", projection_kind(T.Q8_0))
    plain = load(path, "none", quant="gguf-q8", warm_up=False, cache_dir=files)
    expected = [plain.engine.generate(p, greedy_params()).tokens for p in PROMPTS]
    pipe = plain.with_speculative(SpeculativeConfig(method="draft-model", model=str(path), draft_quant="gguf-q8",
                                                    hot_vocab=16))
    drafter = pipe.engine.drafter
    assert isinstance(drafter._hot_head, BlockQ8Linear) and drafter._hot_lean.kinds[-1] == Q8X
    results = [pipe.engine.generate(p, greedy_params()) for p in PROMPTS]
    assert [r.tokens for r in results] == expected
    draft = drafter.model
    ids = torch.tensor([3, 9, 27, 5])
    hot, full = (step(ids, torch.arange(4), draft.new_cache(8))[0] for step in (drafter._hot_lean, draft.lean))
    torch.testing.assert_close(drafter.hot.expand(hot)[:, drafter.hot.ids], full[:, drafter.hot.ids])
    assert torch.isinf(drafter.hot.expand(hot)).sum() == 4 * (48 - 16)


def test_an_unsupported_block_type_is_named(files):
    path = tiny_gguf(files / "tiny-q2_k.gguf", lambda name: T.Q2_K if name.endswith("down_proj.weight") else None)
    with pytest.raises(ForetellError, match=r"Q2_K \(blk\.0\.ffn_down\.weight\).*Q4_0, .*Q4_K, Q5_K, Q6_K"):
        load(path, "none", quant="gguf", warm_up=False, cache_dir=files)


@pytest.mark.parametrize("case", ["llama3.1", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_every_gguf_architecture_keeps_its_blocks(case, files):
    """Each architecture's files (test_families_gguf's: their tensor names, Phi-3's fused qkv and gate_up, Gemma's
    tied embedding as the output layer) with Q8_0 projections and a Q5_0 embedding: every projection keeps its
    blocks, and the logits are the dense load's (PyTorch's path where the lean step does not run the family)."""
    from test_families import build
    from test_families_gguf import CASES, write_gguf

    family, changes, arch, name, metadata, tensors = CASES[case]
    hf = build(family, **changes)
    path = write_gguf(hf, arch, files / f"arch-{case}.gguf", name, metadata(hf), tensors(hf),
                      blocks=lambda n: T.Q8_0 if n.endswith("proj.weight") or n == "lm_head.weight" else
                      T.Q5_0 if n == "model.embed_tokens.weight" else None)
    kept = load(path, "none", quant="gguf", warm_up=False, cache_dir=files).target.model
    dense = load(path, "none", warm_up=False, cache_dir=files).target.model
    assert sum(isinstance(m, GGUFLinear) for m in kept.layers.modules()) == 4 * len(kept.layers)
    tied = hf.config.tie_word_embeddings
    assert isinstance(kept.lm_head, GGUFLinear if tied else BlockQ8Linear)  # Q5_0 embedding, or Q8_0 output layer
    ids = torch.tensor([1, 5, 9, 12, 5, 9, 30, 7, 7, 20])
    want = dense(ids, torch.arange(10), dense.new_cache(16)).logits
    got = kept(ids, torch.arange(10), kept.new_cache(16)).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max())


def test_the_header_reader_and_the_weights_left_unread(q4_k_m, files, tmp_path):
    """read_tensor_table finds what gguf.GGUFReader finds (types, dims, bytes) from the header alone, and names a
    truncated file; loading a --quant gguf model leaves exactly the projections the blocks replace unread, and a
    layer left dense over unread weights is an error, not silent garbage."""
    from torch import nn

    from foretell.models.gguf_meta import read_tensor_table
    from foretell.runtime.gguf_quant import check_replaced, replaced_weights

    arch, table = read_tensor_table(q4_k_m)
    reader = gguf.GGUFReader(str(q4_k_m))
    assert arch == "llama" and set(table) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        mine = table[t.name]
        assert mine.tensor_type == t.tensor_type and mine.shape == tuple(int(d) for d in t.shape)
        assert np.array_equal(mine.data, np.asarray(t.data).view(np.uint8).reshape(-1))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(q4_k_m.read_bytes()[:-100])
    with pytest.raises(ForetellError, match="ends inside tensor"):
        read_tensor_table(cut)
    skipped = replaced_weights(q4_k_m)
    layers = len({n.split(".")[1] for n in table if n.startswith("blk.")})
    assert skipped == {f"layers.{i}.{p}.weight" for i in range(layers)
                       for p in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
    kept = load(q4_k_m, "none", quant="gguf", warm_up=False, cache_dir=files).target.model
    check_replaced(kept, skipped)  # every unread weight's layer holds blocks now
    kept.layers[0].o_proj = nn.Linear(kept.config.hidden_size, kept.config.hidden_size, bias=False)
    with pytest.raises(ForetellError, match="layers.0.o_proj.weight was left unread"):
        check_replaced(kept, skipped)
