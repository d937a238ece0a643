"""One native pass for every request in a batch (runtime/packed.py, kernels/lean_decode.cpp lean_decode_packed):
each sequence's rows compute bit for bit what its own lean pass computes, whatever rides beside them, and a
request's greedy tokens in a batch of four (mixed prompt lengths and drafters) equal its tokens alone, on dense
fp32 weights and on a GGUF file's Q4_1 blocks (float and 8-bit activations)."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, make_hf_model, perturbed_copy
from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.decoding import TargetPass
from foretell.errors import ForetellError
from foretell.kernels import lean_decode
from foretell.prefix_cache import PrefixCache
from foretell.runtime import packed
from foretell.runtime.drafter_modules import quantize_drafter, use_lean_step
from foretell.types import SamplingParams

pytestmark = pytest.mark.skipif(lean_decode() is None, reason="the lean step's kernel cannot be built on this machine")

GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


def tree_mask(parents: list[int]) -> torch.Tensor:
    mask = torch.eye(len(parents), dtype=torch.bool)
    for node, parent in enumerate(parents):
        while parent >= 0:
            mask[node, parent] = True
            parent = parents[parent]
    return mask


def prefilled(model, context: list[int]):
    cache = model.new_cache(64)
    model(torch.tensor(context), torch.arange(len(context)), cache)
    cache.commit_prefix(len(context))
    return cache


def clone_cache(model, cache):
    copy = model.new_cache(64)
    copy.k.copy_(cache.k)
    copy.v.copy_(cache.v)
    copy.length = cache.length
    return copy


@pytest.mark.parametrize("quant", ["none", "int4", "int4-q8"])
def test_each_sequence_in_a_packed_pass_computes_what_it_computes_alone(tiny_pair, quant):
    model = load(tiny_pair[0], "none", quant=quant, warm_up=False).target.model
    assert model.lean is not None
    contexts = [[1, 5, 9, 12, 5], [1, 7], list(range(1, 40))]
    caches = [prefilled(model, c) for c in contexts]
    # a one-token step, a 4-node tree and a 3-token chain, after contexts of 5, 2 and 39 tokens
    passes = [
        TargetPass(torch.tensor([9]), torch.tensor([5]), caches[0], hidden_layers=(1,)),
        TargetPass(torch.tensor([9, 30, 7, 12]), 2 + torch.tensor([0, 1, 1, 2]), caches[1],
                   tree_mask=tree_mask([-1, 0, 0, 1]), hidden_layers=(0, 2)),
        TargetPass(torch.tensor([3, 4, 5]), torch.tensor([39, 40, 41]), caches[2], logits_rows=slice(2, 3)),
    ]
    alone_caches = [clone_cache(model, c) for c in caches]
    together = packed.lean_packed(model, passes)
    for p, cache, out in zip(passes, alone_caches, together):
        alone = model(p.input_ids, p.positions, cache, p.tree_mask, p.hidden_layers, p.logits_rows)
        assert torch.equal(out.logits, alone.logits)
        assert set(out.hidden) == set(alone.hidden)
        assert all(torch.equal(out.hidden[i], alone.hidden[i]) for i in alone.hidden)
        end = p.cache.length + p.input_ids.shape[0]
        assert torch.equal(p.cache.k[:, :, :, :end], cache.k[:, :, :, :end])
        assert torch.equal(p.cache.v[:, :, :, :end], cache.v[:, :, :, :end])
    assert together[2].logits.shape[0] == 1


def test_a_prompt_chunk_asks_for_no_logits(tiny_pair):
    model = load(tiny_pair[0], "none", quant="int4-q8", warm_up=False).target.model
    cache = model.new_cache(64)
    step = TargetPass(torch.arange(1, 41), torch.arange(40), cache, hidden_layers=(1,), logits_rows=slice(0, 0))
    out = packed.forward_packed(model, [step])[0]
    assert out.logits.shape == (0, model.config.vocab_size) and out.hidden[1].shape[0] == 40


class CountingKernel:
    """Wraps a LeanStep's packed kernel and records how many sequences each call carried."""

    def __init__(self, step):
        self.step, self.inner, self.segments = step, step.kernel_packed, []

    def __enter__(self):
        self.step.kernel_packed = self
        return self

    def __exit__(self, *exc):
        self.step.kernel_packed = self.inner

    def __call__(self, *args):
        self.segments.append(len(args[3]))
        return self.inner(*args)


def assert_batch_of_four_decodes_as_alone(plain, draft_folder):
    """Two prompts of different lengths beside two other requests (a draft tree, prompt lookup and a draft model
    among them, one sampled): each greedy request's tokens equal its tokens alone, and the passes were packed."""
    specs = {"none": SpeculativeConfig(method="none"), "prompt-lookup": SpeculativeConfig(gamma=3),
             "draft-model": SpeculativeConfig(method="draft-model", model=str(draft_folder), gamma=3,
                                              draft_quant="none"),
             "draft-tree": SpeculativeConfig(method="draft-tree", model=str(draft_folder), draft_quant="none")}
    pipes = {name: plain.with_speculative(spec) for name, spec in specs.items()}
    long_prompt = [(5 * i + 1) % 48 for i in range(45)]
    requests = [(PROMPTS[0], "draft-tree", GREEDY), (long_prompt, "prompt-lookup", GREEDY),
                (PROMPTS[2], "draft-model", GREEDY), (PROMPTS[1], "none", GREEDY),
                (PROMPTS[3], "draft-tree", SamplingParams(temperature=1.0, seed=3, max_new_tokens=12))]
    greedy = [r for r in requests if r[2].temperature == 0]
    alone = [pipes[name].engine.generate(prompt, params).tokens for prompt, name, params in greedy]
    batch = plain.batch_engine(None, max_batch=4, prefix_cache=PrefixCache(1 << 24, min_tokens=8))
    collected = []
    for prompt, name, params in requests:
        tokens: list[int] = []
        batch.submit(prompt, params, lambda c, t=tokens: t.extend(c.tokens), pytest.fail, pipes[name].engine)
        collected.append(tokens)
    with CountingKernel(plain.target.model.lean) as kernel:
        batch.run()
    assert [t for t, r in zip(collected, requests) if r[2].temperature == 0] == alone
    assert max(kernel.segments) == 4  # four sequences in one native pass
    # the long prompt again, and a longer prompt starting with it, beside a third request: rows from the prefix cache
    again = [(long_prompt, "draft-tree"), (long_prompt + [7, 8, 9], "none"), (PROMPTS[0], "prompt-lookup")]
    results = []
    for prompt, name in again:
        batch.submit(prompt, GREEDY, lambda c, out=results: out.append(c) if c.result else None, pytest.fail,
                     pipes[name].engine)
    batch.run()
    results.sort(key=lambda c: c.result.stats.prompt_tokens)  # as `again` by prompt length
    # the next turn shares the first answer's rows too, as far as its first token (the first answer goes on
    # otherwise): 45 prompt rows
    assert [c.result.stats.cached_prompt_tokens for c in results] == [0, 44, 45]
    by_length = sorted(again, key=lambda r: len(r[0]))
    assert [c.result.tokens for c in results] == [pipes[name].engine.generate(prompt, GREEDY).tokens
                                                  for prompt, name in by_length]


def test_a_batch_of_four_decodes_as_alone_on_float32_weights(tiny_pair):
    assert_batch_of_four_decodes_as_alone(load(tiny_pair[0], "none", warm_up=False), tiny_pair[1])


@pytest.mark.parametrize("quant,kv_dtype", [("gguf", None), ("gguf-q8", None), ("gguf-q8", "float16")])
def test_a_batch_of_four_decodes_as_alone_on_gguf_q4_1_blocks(tiny_pair, tmp_path, quant, kv_dtype):
    pytest.importorskip("gguf")
    from test_families_gguf import write_gguf

    hf = make_hf_model("llama", 48, seed=0)  # tiny_pair's target, its projections as Q4_1 blocks
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    path = write_gguf(hf, "llama", tmp_path / "tiny-q4_1.gguf",
                      q4_1=lambda name: name.endswith(tuple(f"{p}.weight" for p in projections)))
    draft = write_gguf(perturbed_copy(hf, noise=0.5, seed=1), "llama", tmp_path / "draft.gguf")  # same vocabulary
    plain = load(path, "none", quant=quant, warm_up=False, cache_dir=tmp_path, kv_dtype=kv_dtype)
    assert plain.target.model.lean is not None and plain.target.model.lean.kinds[0] in (0, 3)  # Q4, Q4X
    assert plain.target.model.new_cache(8).k.dtype == (torch.float16 if kv_dtype else torch.float32)
    assert_batch_of_four_decodes_as_alone(plain, draft)


def test_a_float16_kv_cache_is_read_natively_as_pytorch_reads_it(tiny_pair):
    """kv_dtype="float16": the target's caches hold half the bytes; the lean step's passes (native float16 loads) and
    PyTorch's (the rows widened) compute the same logits up to summation order, close to a float32 cache's but
    not equal (lossy); speculation reproduces plain decoding with that cache exactly."""
    half = load(tiny_pair[0], "none", kv_dtype="float16", warm_up=False)
    torch_half = load(tiny_pair[0], "none", kv_dtype="float16", lean=False, warm_up=False)
    full = load(tiny_pair[0], "none", warm_up=False)
    assert half.target.model.lean is not None and torch_half.target.model.lean is None
    context, steps = list(range(1, 40)), torch.tensor([9, 30, 7])
    logits = []
    for pipe in (half, torch_half, full):
        model = pipe.target.model
        cache = prefilled(model, context)
        logits.append(model(steps, torch.arange(39, 42), cache).logits)
        assert cache.k.dtype == (torch.float32 if pipe is full else torch.float16)
    assert half.target.model.new_cache(64).nbytes() * 2 == full.target.model.new_cache(64).nbytes()
    assert torch.allclose(logits[0], logits[1], atol=1e-4, rtol=0)
    assert not torch.equal(logits[0], logits[2]) and torch.allclose(logits[0], logits[2], atol=1e-2, rtol=0)
    lookup = half.with_speculative(SpeculativeConfig(gamma=3))
    for prompt in PROMPTS:
        assert lookup.engine.generate(prompt, GREEDY).tokens == half.engine.generate(prompt, GREEDY).tokens
    with pytest.raises(ForetellError, match="KV cache dtype"):
        load(tiny_pair[0], "none", kv_dtype="bfloat16", warm_up=False)


def test_a_parallel_head_on_a_target_with_8_bit_activations_drafts_in_int8(tiny_pair, tmp_path):
    """draft_quant "auto" on a target with 8-bit activations: the head's fuse and layers as int8, its layers' products
    with 8-bit activations too (as the target's), and greedy output still the target's plain decoding."""
    pytest.importorskip("gguf")
    from test_families_gguf import write_gguf

    from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head, save_parallel_head
    from foretell.runtime.quant import Int8Linear

    hf = make_hf_model("llama", 48, seed=0)
    path = write_gguf(hf, "llama", tmp_path / "tiny-q4_1.gguf", q4_1=lambda name: name.endswith("proj.weight"))
    plain = load(path, "none", quant="gguf-q8", warm_up=False, cache_dir=tmp_path)
    target = plain.target.model
    folder = save_parallel_head(new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=2),
                                tmp_path / "head")
    spec = SpeculativeConfig(method="parallel-head", model=str(folder))
    head = plain.with_speculative(spec).engine.drafter.head
    assert isinstance(head.fuse, Int8Linear) and head.lean is not None and head.lean.act_q8
    for prompt in PROMPTS:
        assert plain.with_speculative(spec).engine.generate(prompt, GREEDY).tokens == \
            plain.engine.generate(prompt, GREEDY).tokens


@pytest.mark.parametrize("draft_quant", ["auto", "int4"])
def test_an_eagle3_head_on_a_target_with_8_bit_activations_decodes_as_plain(tiny_pair, tmp_path, draft_quant):
    """An EAGLE-3 head on a GGUF Q4_1 target with 8-bit activations, as int8 ("auto") or int4 blocks: its lean step
    takes the 8-bit activations (Q8X / Q4X products) and greedy output is the target's plain decoding."""
    pytest.importorskip("gguf")
    from test_eagle3 import make_head
    from test_families_gguf import write_gguf

    from foretell.models.eagle3 import save_eagle3_head
    from foretell.runtime.quant import Int4Linear, Int8Linear

    hf = make_hf_model("llama", 48, seed=0)
    path = write_gguf(hf, "llama", tmp_path / "tiny-q4_1.gguf", q4_1=lambda name: name.endswith("proj.weight"))
    plain = load(path, "none", quant="gguf-q8", warm_up=False, cache_dir=tmp_path)
    folder = save_eagle3_head(make_head(plain.target.model, seed=3, draft_ids=torch.arange(4, 36)), tmp_path / "e3")
    spec = SpeculativeConfig(method="eagle3", model=str(folder), draft_quant=draft_quant)
    pipe = plain.with_speculative(spec)
    head = pipe.engine.drafter.head
    kind = Int4Linear if draft_quant == "int4" else Int8Linear
    assert isinstance(head.lm_head, kind) and isinstance(head.midlayer.down_proj, kind)
    assert head.lean is not None and head.lean.act_q8
    for prompt in PROMPTS:
        assert pipe.engine.generate(prompt, GREEDY).tokens == plain.engine.generate(prompt, GREEDY).tokens


@pytest.mark.parametrize("method,draft_quant", [("draft-model", "gguf-q8"), ("draft-model", "none"),
                                                ("draft-tree", "gguf-q8")])
def test_a_batch_packs_its_draft_models_forwards(tmp_path, method, draft_quant):
    """Four requests drafting with one draft model: their draft forwards run together, depth by depth (one native
    call over the four on the draft's GGUF blocks; one PyTorch forward on float32 weights), a tree's level by level.
    Each request's tokens equal its tokens alone; on the blocks a chain's drafts too (the same accepted drafts by
    position), since every row gets the arithmetic it gets alone (a tree's size also follows measured times)."""
    pytest.importorskip("gguf")
    from test_families_gguf import write_gguf

    from foretell.drafters.base import DraftPass
    from foretell.runtime import packed

    hf = make_hf_model("llama", 48, seed=0)
    target = write_gguf(hf, "llama", tmp_path / "target.gguf")  # tiny_pair's target, as a GGUF file's tokenizer
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    draft = write_gguf(perturbed_copy(hf, noise=0.5, seed=1), "llama", tmp_path / "draft.gguf",
                       q4_1=lambda name: name.endswith(tuple(f"{p}.weight" for p in projections)))
    plain = load(target, "none", warm_up=False, cache_dir=tmp_path)
    options = {"gamma": 3} if method == "draft-model" else {}
    pipe = plain.with_speculative(SpeculativeConfig(method=method, model=str(draft), draft_quant=draft_quant,
                                                    **options))
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], [(5 * i + 1) % 48 for i in range(30)]]
    alone = [pipe.engine.generate(p, GREEDY) for p in prompts]
    groups = []
    inner = packed.run_draft_passes

    def counting(passes):
        assert all(isinstance(p, DraftPass) for p in passes)
        groups.append(len(passes))
        return inner(passes)

    batch = plain.batch_engine(None, max_batch=4)
    collected, stats = [], []
    for p in prompts:
        tokens: list[int] = []
        batch.submit(p, GREEDY, lambda c, t=tokens: (t.extend(c.tokens), c.result and stats.append(c.result)),
                     pytest.fail, pipe.with_speculative(pipe.speculative).engine)
        collected.append(tokens)
    import foretell.batching as batching
    original = batching.run_draft_passes
    batching.run_draft_passes = counting
    try:
        batch.run()
    finally:
        batching.run_draft_passes = original
    assert collected == [r.tokens for r in alone]
    assert max(groups) == 4  # the four requests' draft forwards in one call
    if (method, draft_quant) == ("draft-model", "gguf-q8"):
        by_tokens = {tuple(r.tokens): r.stats.accepted_per_position for r in alone}
        assert all(by_tokens[tuple(r.tokens)] == r.stats.accepted_per_position for r in stats)


def head_drafters(target, kind: str):
    """A drafter module of `kind` for the tiny target in the lean step, and a factory of drafters over it (one a
    request: each keeps its own cache)."""
    from test_eagle3 import make_head
    from test_hidden_state import make_draft

    from foretell.config import EagleTreeShape, HeadTreeShape, HiddenStateOptions
    from foretell.drafters.eagle_tree import Eagle3Drafter
    from foretell.drafters.hidden_tree import HiddenStateDrafter
    from foretell.drafters.parallel_tree import ParallelHeadDrafter
    from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head

    if kind == "eagle3":
        module = make_head(target, seed=2)
        return module, lambda: Eagle3Drafter(module, EagleTreeShape(depth=4, width=3, max_nodes=10))
    if kind.startswith("parallel-head"):
        module = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, depth=4), seed=2)
        if kind == "parallel-head-int8-q8":  # as on a target with 8-bit activations (DrafterWeights.ready)
            quantize_drafter(module, "int8")
        return module, lambda: ParallelHeadDrafter(module, HeadTreeShape(max_nodes=10, depth=4, width=3))
    module = make_draft(target, seed=2)
    return module, lambda: HiddenStateDrafter(module, HiddenStateOptions(depth=4, width=3, max_nodes=10))


@pytest.mark.parametrize("kind", ["eagle3", "parallel-head", "parallel-head-int8-q8", "hidden-state"])
def test_a_batch_packs_its_head_steps(tiny_pair, kind):
    """Four requests drafting with one EAGLE-3 head, parallel head or hidden-state draft in the lean step: their
    module's passes run as one native call (the context each feeds, then an EAGLE-3 tree level by level, a
    hidden-state chain step by step), each row with the arithmetic it gets alone, so each request's tokens, and
    its drafts' acceptance by position, equal its own alone."""
    plain = load(tiny_pair[0], "none", warm_up=False)
    module, drafter = head_drafters(plain.target.model, kind)
    assert (use_lean_step(module, act_q8=True) if kind.endswith("q8") else use_lean_step(module)) is None
    assert getattr(module.lean, "act_q8", False) == kind.endswith("q8")
    engine = lambda: plain.with_drafter(drafter()).engine  # noqa: E731
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], [(5 * i + 1) % 48 for i in range(30)]]
    alone = [engine().generate(p, GREEDY) for p in prompts]
    batch = plain.batch_engine(None, max_batch=4)
    collected, stats = [], {}
    for i, p in enumerate(prompts):
        tokens: list[int] = []
        batch.submit(p, GREEDY, lambda c, t=tokens, i=i: (t.extend(c.tokens), c.result and stats.update({i: c.result})),
                     pytest.fail, engine())
        collected.append(tokens)
    with CountingKernel(module.lean) as kernel:
        batch.run()
    assert collected == [r.tokens for r in alone]
    assert max(kernel.segments) == 4  # the four requests' passes in one call
    assert [stats[i].stats.accepted_per_position for i in range(4)] == [r.stats.accepted_per_position for r in alone]
