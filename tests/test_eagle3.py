"""The EAGLE-3 drafter on tiny models: exact greedy output, sampled losslessness, the training forward
against inference, the tree it proposes, saving and loading, and its configuration."""

from __future__ import annotations

import pytest
import torch

from conftest import (
    PROMPTS, assert_exact_near_the_token_limit, assert_greedy_equals_plain, greedy_params, recorded_proposals,
)
from foretell.api import load
from foretell.config import EagleTreeShape, SpeculativeConfig
from foretell.drafters.eagle_tree import Eagle3Drafter
from foretell.errors import ForetellError
from foretell.models.eagle3 import Eagle3Config, default_aux_layers, new_eagle3_head, save_eagle3_head
from foretell.models.eagle3_format import load_eagle3_head
from foretell.runtime.drafter_modules import quantize_drafter, use_lean_step
from foretell.sizing.cost import CostCurve
from foretell.sizing.tree import AdaptiveTreeScheduler
from foretell.tree import depths
from foretell.types import SamplingParams
from test_engine_statistical import assert_tree_samples_follow_target

GREEDY = greedy_params()
DRAFT_IDS = torch.tensor([0, 2, 4, 5] + list(range(7, 43)))  # 40 of the 48 tokens


def make_head(target, seed: int = 0, draft_ids=DRAFT_IDS, **config):
    config = Eagle3Config.for_target(target.config, draft_vocab_size=len(draft_ids), **config)
    return new_eagle3_head(target, config, seed=seed, draft_vocab=draft_ids)


def with_eagle(plain, shape=EagleTreeShape(), scheduler=None, **config):
    return plain.with_drafter(Eagle3Drafter(make_head(plain.target.model, **config), shape, scheduler))


# --- exactness -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape, config", [
    (EagleTreeShape(), {}),
    (EagleTreeShape(depth=2, width=2, max_nodes=3), {"aux_layers": (0, 1, 2)}),
    (EagleTreeShape(depth=1, width=1, max_nodes=1), {}),
    (EagleTreeShape(depth=7, width=3, max_nodes=40), {"aux_layers": (1, 2)}),
])
def test_greedy_equals_plain(plain, shape, config):
    assert_greedy_equals_plain(plain, with_eagle(plain, shape, **config))


def test_greedy_equals_plain_near_the_token_limit_and_with_the_scheduler(plain):
    curve = CostCurve([1, 8, 64], [0.010, 0.012, 0.030], context=256)
    for spec in (with_eagle(plain), with_eagle(plain, scheduler=AdaptiveTreeScheduler(curve))):
        assert_exact_near_the_token_limit(plain, spec)
    assert spec.engine.drafter.scheduler.history, "the scheduler chose the budgets"


def test_int8_head_is_exact_and_quantizes_its_layer_and_output(plain):
    from foretell.runtime.quant import Int8Linear

    head = quantize_drafter(make_head(plain.target.model, seed=4), "int8")
    assert isinstance(head.lm_head, Int8Linear) and isinstance(head.midlayer.qkv_proj, Int8Linear)
    assert not isinstance(head.fc, Int8Linear)  # run once a pass; it also places the module
    assert quantize_drafter(head, "int8").lm_head is head.lm_head  # quantizing twice changes nothing
    assert_greedy_equals_plain(plain, plain.with_drafter(Eagle3Drafter(head)))
    assert not isinstance(quantize_drafter(make_head(plain.target.model), "none").lm_head, Int8Linear)


def test_int4_head_is_exact_and_quantizes_where_its_shapes_fit(plain):
    """draft_quant int4: the layer's projections and a draft output layer of whole 16-column groups as int4 groups of
    32 (half int8's bytes a step), an output layer of 40 columns as int8; greedy output still plain decoding's."""
    from foretell.runtime.quant import Int4Linear, Int8Linear

    head = quantize_drafter(make_head(plain.target.model, seed=4, draft_ids=torch.arange(4, 36)), "int4")
    assert isinstance(head.lm_head, Int4Linear) and isinstance(head.midlayer.qkv_proj, Int4Linear)
    assert quantize_drafter(head, "int4").lm_head is head.lm_head  # quantizing twice changes nothing
    assert_greedy_equals_plain(plain, plain.with_drafter(Eagle3Drafter(head)))
    assert isinstance(quantize_drafter(make_head(plain.target.model, seed=4), "int4").lm_head, Int8Linear)


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_lean_head_steps_match_pytorch_and_decode_exactly(plain, quant):
    """The head's native step (runtime/lean_drafters.LeanEagle3Step): a chain of context rows and a tree level give
    PyTorch's outputs and logits up to rounding, and greedy decoding with it equals plain decoding."""
    from foretell.kernels import lean_decode

    if lean_decode() is None:
        pytest.skip("the lean step's kernel cannot be built on this machine")
    head = quantize_drafter(make_head(plain.target.model, seed=6), quant)
    assert use_lean_step(head) is None and head.lean is not None
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, head.config.hidden_size, generator=g)
    tokens = torch.tensor([3, 9, 11, 4, 20])
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # rows 1 and 2 are children of 0
    results = {}
    for lean in (True, False):
        head.lean = head.lean if lean else None
        cache = head.new_cache(16)
        with torch.inference_mode():
            chain = head.step_and_logits(tokens, hidden, torch.arange(5), cache)
            cache.commit_prefix(5)
            level = head.step_and_logits(tokens[:3], hidden[:3], torch.tensor([5, 6, 6]), cache, tree_mask=tree)
        results[lean] = (*chain, *level)
        use_lean_step(head)
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert_greedy_equals_plain(plain, plain.with_drafter(Eagle3Drafter(head)))


def test_lean_head_scores_only_the_last_row_when_asked(plain):
    """Feeding context rows needs the last row's logits only: the native step then runs the layer alone and the
    output layer (int8 columns) over that row; outputs, cache and logits match PyTorch's up to rounding."""
    from foretell.kernels import lean_decode

    if lean_decode() is None:
        pytest.skip("the lean step's kernel cannot be built on this machine")
    head = quantize_drafter(make_head(plain.target.model, seed=8, draft_ids=torch.arange(4, 36)), "int8")  # 32 columns
    assert use_lean_step(head) is None and head.lean.output is not None
    lean = head.lean
    hidden = torch.randn(6, head.config.hidden_size, generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([3, 9, 11, 4, 20, 7])
    results = {}
    for on in (True, False):
        head.lean = lean if on else None
        cache = head.new_cache(16)
        with torch.inference_mode():
            out, logits = head.step_and_logits(tokens, hidden, torch.arange(6), cache, last_only=True)
        assert logits.shape == (1, 32)
        results[on] = (out, logits, cache.k[:, :, :, :6].clone())
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    head.lean = lean
    assert_greedy_equals_plain(plain, plain.with_drafter(Eagle3Drafter(head)))


def test_a_configured_head_steps_natively_on_a_float32_target(plain, tmp_path, tiny_pair):
    from foretell.kernels import lean_decode

    folder = save_eagle3_head(make_head(plain.target.model, seed=1), tmp_path / "head")
    pipe = load(tiny_pair[0], SpeculativeConfig(method="eagle3", model=str(folder)), warm_up=False)
    assert (pipe.engine.drafter.head.lean is not None) == (lean_decode() is not None)
    off = load(tiny_pair[0], SpeculativeConfig(method="eagle3", model=str(folder)), lean=False, warm_up=False)
    assert off.engine.drafter.head.lean is None  # lean=False keeps PyTorch's path for the head too


@pytest.fixture(scope="module")
def micro_pipe(micro):
    hf_target, root = micro
    return hf_target, load(root / "t", "none", warm_up=False)


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)], ids=["t1.0", "t0.7-top_p0.9"]
)
def test_sampled_output_follows_the_target(micro_pipe, params):
    """Exact marginals of the first NEW tokens by enumeration vs 1500 seeded engine runs; the draft
    vocabulary leaves out 2 of the 8 tokens, so the id map and the zero-q tokens are exercised too."""
    hf_target, pipe = micro_pipe
    target = pipe.target.model
    head = make_head(target, seed=5, draft_ids=torch.tensor([0, 1, 3, 4, 6, 7]))
    spec = pipe.with_drafter(Eagle3Drafter(head, EagleTreeShape(depth=3, width=3, max_nodes=8)))
    assert_tree_samples_follow_target(spec, hf_target, params)


# --- the head: training forward, tree, vocabulary --------------------------------------------


def test_training_forward_matches_inference(plain):
    """forward_training's unrolled steps equal feeding the context, then the true tokens one by one."""
    target = plain.target.model
    head = make_head(target, seed=3, aux_layers=(0, 1, 2))
    ids = torch.randint(3, 48, (1, 20), generator=torch.Generator().manual_seed(0))
    features = head.features(target.forward_sequences(ids, hidden_layers=head.config.aux_layers).hidden)
    anchors, K = torch.tensor([0, 4, 9, 13]), 4
    with torch.no_grad():
        trained = head.forward_training(features[:, :14], ids, anchors, K)[0]
        for k, a in enumerate(anchors.tolist()):
            cache = head.new_cache(64)
            out = head.step(ids[0, 1 : a + 2], head.fc(features[0, : a + 1]), torch.arange(a + 1), cache)
            cache.commit_prefix(a + 1)
            states = [out[-1]]
            for j in range(1, K):
                states.append(head.step(ids[0, a + 1 + j : a + 2 + j], states[-1][None], torch.tensor([a + j]), cache)[-1])
                cache.commit_prefix(1)
            torch.testing.assert_close(torch.stack(states), trained[k], atol=1e-5, rtol=1e-4)


def test_proposals_are_best_first_trees_within_the_budget_and_the_draft_vocabulary(plain):
    shape = EagleTreeShape(depth=4, width=3, max_nodes=10)
    seen = recorded_proposals(with_eagle(plain, shape), PROMPTS[0], GREEDY)
    assert seen
    allowed = set(DRAFT_IDS.tolist())
    for proposal in seen:
        if not proposal.size:
            continue
        assert proposal.size <= 10 and int(depths(proposal.parents).max()) <= 4
        assert all(p < i for i, p in enumerate(proposal.parents.tolist()))
        assert set(proposal.tokens.tolist()) <= allowed
        children = {}
        for token, parent in zip(proposal.tokens.tolist(), proposal.parents.tolist()):
            children.setdefault(parent, []).append(token)
        assert all(len(c) == len(set(c)) <= 3 for c in children.values())  # top-k siblings, distinct
        assert proposal.draft_prob is not None and bool(((proposal.draft_prob > 0) & (proposal.draft_prob <= 1)).all())


def test_a_tree_node_drafts_what_its_path_drafts_as_a_chain(plain):
    """Each tree row sees the committed rows and its own path only (the tree mask): following the best child down
    a width-3 tree gives the tokens a width-1 head (a chain) drafts from the same context. A row that also saw a
    sibling or a cousin would draft something else below depth 1."""
    chain = recorded_proposals(with_eagle(plain, EagleTreeShape(depth=5, width=1, max_nodes=5)), PROMPTS[0], GREEDY)[0]
    tree = recorded_proposals(with_eagle(plain, EagleTreeShape(depth=5, width=3, max_nodes=64)), PROMPTS[0], GREEDY)[0]
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    node, walked = -1, []
    while True:
        children = [i for i, p in enumerate(parents) if p == node]  # best first: the proposal is best-first
        if not children:
            break
        node = children[0]
        walked.append(node)
    assert len(walked) >= 3  # the walk went past depth 1 (a mask error shows from depth 2)
    assert [tokens[i] for i in walked] == chain.tokens.tolist()[: len(walked)]
    # and with the same probabilities: a row that saw more keys would shift them even where the argmax held
    torch.testing.assert_close(tree.draft_prob[walked], chain.draft_prob[: len(walked)], rtol=1e-5, atol=1e-6)


def _grown(limit: int, width: int, depth: int, prune: bool, seed: int = 0):
    """An EAGLE-2 growth over synthetic children (each node's children fixed by its path), expanding per
    worth_expanding or every one of the level's `width` best; the nodes and the number of rows expanded."""
    import random

    from foretell.drafters.eagle_tree import _Nodes

    def children(path):
        rng = random.Random(f"{seed}-{path}")
        weights = sorted((rng.random() ** 3 for _ in range(width)), reverse=True)
        return [w / (sum(weights) + rng.random()) for w in weights], [rng.randrange(50) for _ in weights]

    nodes, paths, rows = _Nodes(), {-1: ()}, 0
    probs, columns = children(())
    level = nodes.add_top(-1, probs, columns)
    for node in level:
        paths[node] = (nodes.columns[node],)
    for _ in range(depth - 1):
        expand = (nodes.worth_expanding(level, width, limit) if prune
                  else sorted(level, key=nodes.rank)[:width])
        rows += len(expand)
        level = []
        for node in expand:
            probs, columns = children(paths[node])
            for child in nodes.add_top(node, probs, columns):
                paths[child] = paths[node] + (nodes.columns[child],)
                level.append(child)
    return nodes, rows


@pytest.mark.parametrize("limit,width", [(1, 4), (3, 4), (8, 4), (5, 2), (64, 3)])
def test_growth_skips_only_nodes_that_cannot_be_proposed(limit, width):
    """A node already outside the `limit` best stays out with all its descendants: not expanding it leaves the
    proposal (best(limit)) as it is, and saves its head rows."""
    saved = 0
    for seed in range(20):
        full, full_rows = _grown(limit, width, 6, prune=False, seed=seed)
        pruned, pruned_rows = _grown(limit, width, 6, prune=True, seed=seed)
        best_full = [(full.columns[i], full.depths[i], full.scores[i]) for i in full.best(limit)]
        best_pruned = [(pruned.columns[i], pruned.depths[i], pruned.scores[i]) for i in pruned.best(limit)]
        assert best_pruned == best_full
        assert pruned_rows <= full_rows
        saved += full_rows - pruned_rows
    assert saved > 0 if limit < 64 else saved == 0


def test_pruned_growth_proposes_what_full_growth_does(plain, monkeypatch):
    from foretell.drafters.eagle_tree import _Nodes

    shape = EagleTreeShape(depth=5, width=3, max_nodes=6)
    pruned = recorded_proposals(with_eagle(plain, shape), PROMPTS[1], GREEDY)
    monkeypatch.setattr(_Nodes, "worth_expanding", lambda self, level, width, limit:
                        sorted(level, key=self.rank)[:width])
    full = recorded_proposals(with_eagle(plain, shape), PROMPTS[1], GREEDY)
    assert len(pruned) == len(full) > 3
    for a, b in zip(pruned, full):
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
        torch.testing.assert_close(a.draft_prob, b.draft_prob)


def test_draft_vocabulary_maps(plain):
    head = make_head(plain.target.model)
    assert torch.equal(head.vocab_ids, DRAFT_IDS)
    assert torch.equal(head.d2t, DRAFT_IDS - torch.arange(len(DRAFT_IDS)))  # EAGLE-3's offsets
    assert int(head.t2d.sum()) == len(DRAFT_IDS) and bool(head.t2d[DRAFT_IDS].all())
    with pytest.raises(ForetellError, match="distinct ids"):
        head.set_draft_vocab(torch.tensor([1, 1, 2]))


def test_default_aux_layers_follow_the_engines():
    assert default_aux_layers(30) == (2, 15, 27)  # SmolLM2-135M: vLLM / SGLang capture the inputs of 2, 15, 27
    assert default_aux_layers(32) == (2, 16, 29)
    assert default_aux_layers(4) == (1, 2, 3) and default_aux_layers(2) == (1,)


def test_save_load_round_trip_and_errors(plain, tmp_path, tiny_pair):
    target = plain.target.model
    head = make_head(target, seed=2)
    folder = save_eagle3_head(head, tmp_path / "head")
    back = load_eagle3_head(folder, target)
    assert back.config == head.config
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), back.state_dict().values()))
    other = load(tiny_pair[1], "none", warm_up=False).target.model  # same shapes, so it loads ...
    load_eagle3_head(folder, other)
    from dataclasses import replace

    from foretell.models.transformer import Transformer

    deeper = Transformer(replace(target.config, num_hidden_layers=3))
    with pytest.raises(ForetellError, match="built for a target with hidden size 64, vocabulary 48 and 2 layers"):
        load_eagle3_head(folder, deeper)
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["d2t"][0] = -1  # a draft column mapped before the first token
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ForetellError, match=f"{folder / 'model.safetensors'}: its d2t maps draft columns outside"):
        load_eagle3_head(folder, target)
    (folder / "eagle3.json").write_text("{}")
    with pytest.raises(ForetellError, match="not a foretell-eagle3"):
        load_eagle3_head(folder, target)


def test_loads_through_the_configuration(plain, tmp_path, tiny_pair):
    save_eagle3_head(make_head(plain.target.model, seed=1), tmp_path / "head")
    spec = SpeculativeConfig(method="eagle3", model=str(tmp_path / "head"), eagle_tree=EagleTreeShape(depth=3),
                             result_cache="prompt")
    pipe = load(tiny_pair[0], spec, warm_up=False)
    assert isinstance(pipe.engine.drafter, Eagle3Drafter) and pipe.engine.drafter.target_layers == (1,)
    for prompt in PROMPTS:
        assert pipe.engine.generate(prompt, GREEDY).tokens == plain.engine.generate(prompt, GREEDY).tokens


# --- configuration ---------------------------------------------------------------------------


def test_configuration_options():
    spec = SpeculativeConfig(method="eagle3", model="h").with_tree(depth=3, width=2, nodes=9)
    assert spec.eagle_tree == EagleTreeShape(depth=3, width=2, max_nodes=9)
    assert SpeculativeConfig.from_dict(spec.to_dict()) == spec
    with pytest.raises(ForetellError, match="hot_vocab .* applies to the draft-model, draft-tree, parallel-head, hidden-state"):
        SpeculativeConfig(method="eagle3", model="h", hot_vocab=64)
    with pytest.raises(ForetellError, match="eagle_tree.max_nodes fixes"):
        SpeculativeConfig(method="eagle3", model="h", eagle_tree=EagleTreeShape(max_nodes=8), budget="auto")
    assert SpeculativeConfig(method="eagle3").model is None  # the target's shipped head (DrafterWeights.folder)
    with pytest.raises(ForetellError, match="eagle_tree .* applies to the eagle3"):
        SpeculativeConfig(method="parallel-head", model="h", eagle_tree=EagleTreeShape(depth=2))
    with pytest.raises(ForetellError, match="eagle3 tree depth, width and max_nodes must be >= 1"):
        EagleTreeShape(width=0)


def test_eagle_flag_picks_the_method(tmp_path):
    from test_config import flags
    from foretell.spec_args import speculative_from_args

    spec = speculative_from_args(flags(eagle="h", tree_budget=12, budget="fixed"), "t")[0]
    assert spec == SpeculativeConfig(method="eagle3", model="h", eagle_tree=EagleTreeShape(max_nodes=12))
    with pytest.raises(ForetellError, match="give one"):
        speculative_from_args(flags(eagle="h", head="x"), "t")


def test_bench_methods(tmp_path):
    from foretell.bench.methods import METHODS, Models, MethodOptions, build_methods, variant_spec

    assert "eagle3" in METHODS and "eagle3-auto" in METHODS
    spec = variant_spec("eagle3-lookup@8").spec(Models("t", eagle="h"), MethodOptions())
    assert spec == SpeculativeConfig(method="eagle3", model="h", result_cache="prompt", draft_quant="none",
                                     eagle_tree=EagleTreeShape(max_nodes=8))
    int8 = variant_spec("eagle3").spec(Models("t", eagle="h", draft_quant="int8"), MethodOptions())
    assert int8.draft_quant == "int8"
    assert variant_spec("eagle3-fp").spec(Models("t", eagle="h", draft_quant="int8"), MethodOptions()).draft_quant == "none"
    with pytest.raises(ForetellError, match="need --eagle"):
        build_methods(["eagle3"], Models("t"), MethodOptions())


def test_a_missing_head_is_named(tmp_path, tiny_pair):
    with pytest.raises(ForetellError, match="no drafter folder"):
        load(tiny_pair[0], SpeculativeConfig(method="eagle3", model=str(tmp_path / "missing")), warm_up=False)
