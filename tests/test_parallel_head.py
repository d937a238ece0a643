"""The parallel draft head (JetSpec) on tiny models: the engine's hidden-state hook,
exact greedy output, sampled losslessness, the tree budget, saving and loading."""

import heapq
import itertools
import math

import pytest
import torch

from conftest import (
    PROMPTS, accepted_drafts, assert_exact_near_the_token_limit, assert_greedy_equals_plain, greedy_params,
    make_hf_model, make_tokenizer, recorded_proposals, save_model_folder,
)
from foretell.api import load
from foretell.config import HeadTreeShape, SpeculativeConfig
from foretell.drafters.base import DrafterBase
from foretell.drafters.parallel_tree import ParallelHeadDrafter, grow_tree
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.errors import ForetellError
from foretell.models.module_folder import WEIGHTS_FILE
from foretell.models.parallel_head import (
    CONFIG_FILE, ParallelHeadConfig, load_parallel_head, new_parallel_head, save_parallel_head,
    training_layout,
)
from foretell.runtime.drafter_modules import use_lean_step
from foretell.sizing.cost import CostCurve
from foretell.sizing.tree import AdaptiveTreeScheduler
from foretell.tree import depths
from foretell.types import Proposal, SamplingParams
from test_engine_statistical import VOCAB, assert_tree_samples_follow_target

GREEDY = greedy_params()


def with_head(plain, shape=HeadTreeShape(), **config):
    target = plain.target.model
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, **config))
    return plain.with_drafter(ParallelHeadDrafter(head, shape))


# --- exactness -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, config",
    [
        (HeadTreeShape(), {}),
        (HeadTreeShape(max_nodes=5, depth=2, width=2), {"num_layers": 2, "fuse_layers": (0, 1, 2)}),
        (HeadTreeShape(max_nodes=1, depth=1, width=1), {"depth": 1}),
        (HeadTreeShape(max_nodes=30, depth=6, width=4), {"depth": 6}),
    ],
)
def test_greedy_equals_plain(plain, shape, config):
    assert_greedy_equals_plain(plain, with_head(plain, shape, **config))


def test_greedy_equals_plain_near_the_token_limit(plain):
    """The tree's depth shrinks to the tokens left; short limits must still be exact."""
    assert_exact_near_the_token_limit(plain, with_head(plain))


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    root = tmp_path_factory.mktemp("micro_head")
    target = make_hf_model("llama", VOCAB, seed=11, init_std=0.5)
    save_model_folder(root / "t", target, make_tokenizer(VOCAB))
    return target, load(root / "t", "none")


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)], ids=["t1.0", "t0.7-top_p0.9"]
)
def test_sampled_output_follows_the_target(micro, params):
    """Exact marginals of the first NEW tokens by enumeration vs 1500 seeded engine runs."""
    hf_target, pipe = micro
    spec = with_head(pipe, HeadTreeShape(max_nodes=8, depth=3, width=3))
    assert_tree_samples_follow_target(spec, hf_target, params)


# --- the engine hook -----------------------------------------------------------------------


class OracleChain(DrafterBase):
    """A chain drafter reading hidden states: proposes a known continuation with planted errors."""

    name = "oracle"
    target_layers = (0, 1, 2)

    def __init__(self, continuation: list[int], prompt_len: int):
        self.continuation, self.prompt_len = continuation, prompt_len
        self.observed: list[dict[int, torch.Tensor]] = []
        self.steps = 0

    def start(self, prompt_ids, capacity, params, generator):
        self.observed, self.steps = [], 0

    def observe(self, hidden):
        self.observed.append(hidden)

    def propose(self, tokens, max_tokens):
        done = len(tokens) - self.prompt_len
        drafts = self.continuation[done : done + min(3, max_tokens)]
        self.steps += 1
        if len(drafts) == 3 and self.steps % 2:
            drafts[1] = (drafts[1] + 1) % 48  # rejected at position 2 every other step
        return Proposal(tokens=torch.tensor(drafts, dtype=torch.long))


class RecordingHead(ParallelHeadDrafter):
    def start(self, *args):
        super().start(*args)
        self.observed = []

    def observe(self, hidden):
        self.observed.append(hidden)
        super().observe(hidden)


def assert_rows_match_full_forward(target, ids: list[int], observed: list[dict], layers):
    """The observed rows, concatenated, are the target's hidden states of ids[:-1]."""
    full = target.forward_sequences(torch.tensor([ids[:-1]]), hidden_layers=layers, with_logits=False).hidden
    for layer in layers:
        rows = torch.cat([h[layer] for h in observed])
        assert rows.shape == (len(ids) - 1, target.config.hidden_size)
        torch.testing.assert_close(rows, full[layer][0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_hook_hands_over_committed_rows_chain(plain, prompt):
    expected = plain.engine.generate(prompt, GREEDY).tokens
    drafter = OracleChain(expected, len(prompt))
    result = plain.with_drafter(drafter).engine.generate(prompt, GREEDY)
    assert result.tokens == expected
    assert 0 < result.stats.acceptance_rate < 1
    assert_rows_match_full_forward(plain.target.model, prompt + result.tokens, drafter.observed, (0, 1, 2))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hook_hands_over_committed_rows_tree(plain, temperature):
    target = plain.target.model
    config = ParallelHeadConfig.for_target(target.config, fuse_layers=(0, 1, 2))
    drafter = RecordingHead(new_parallel_head(target, config))
    spec = plain.with_drafter(drafter)
    params = SamplingParams(temperature=temperature, seed=3, max_new_tokens=40, ignore_eos=True)
    for prompt in PROMPTS[:3]:
        result = spec.engine.generate(prompt, params)
        assert_rows_match_full_forward(target, prompt + result.tokens, drafter.observed, (0, 1, 2))


def test_drafters_without_target_layers_request_no_hidden_states(plain, monkeypatch):
    target = plain.target.model
    requested = []
    original = type(target).forward

    def spy(self, *args, **kwargs):
        requested.append(tuple(kwargs.get("hidden_layers", ())))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(target), "forward", spy)
    plain.with_drafter(PromptLookupDrafter(), gamma=3).engine.generate(PROMPTS[2], GREEDY)
    assert requested and all(r == () for r in requested)
    requested.clear()
    with_head(plain, fuse_layers=(1, 2)).engine.generate(PROMPTS[2], GREEDY)
    assert requested and all(r == (1, 2) for r in requested)


# --- the head model ------------------------------------------------------------------------


def test_training_forward_matches_inference(plain):
    """forward_training's depth-d logits at anchor a equal an inference forward after ids[:a + 2]."""
    target = plain.target.model
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, num_layers=2, depth=4))
    ids = PROMPTS[2] + [5, 6, 7]
    hidden = target.forward_sequences(torch.tensor([ids[:-1]]), hidden_layers=head.config.fuse_layers).hidden
    features, next_tokens = head.features(hidden), torch.tensor([ids[1:]])
    anchors = [0, 3, len(ids) - 2]
    with torch.no_grad():
        trained = head.forward_training(features, next_tokens, anchors)[0]
        for k, a in enumerate(anchors):
            cache = head.new_cache(32)
            inferred = head(features[0, : a + 1], next_tokens[0, : a + 1], cache, num_placeholders=3)
            torch.testing.assert_close(trained[k], inferred, atol=1e-4, rtol=1e-4)


def test_training_layout_by_hand():
    positions, mask, rows = training_layout(3, [0, 2], depth=3)
    assert positions.tolist() == [0, 1, 2, 1, 2, 3, 4]
    assert rows.tolist() == [[0, 3, 4], [2, 5, 6]]
    assert mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 0, 0, 1, 0, 0, 0],  # anchor 0's placeholders see context row 0 only
        [1, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 0],  # anchor 2's see rows 0..2, never another block
        [1, 1, 1, 0, 0, 1, 1],
    ]


def test_save_load_round_trip(plain, tmp_path, tiny_pair):
    target = plain.target.model
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, num_layers=2, fuse_layers=(0, 2)), seed=5)
    save_parallel_head(head, tmp_path / "head")
    loaded = load_parallel_head(tmp_path / "head", target)
    assert loaded.config == head.config
    own = head.state_dict()
    assert {k.split(".")[0] for k in own} == {"fuse", "mask_embedding", "layers", "norm"}  # no target weights
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, own[k])
    assert loaded.shared.lm_head is target.lm_head  # shared, not copied
    # Through the public API: head=PATH picks the parallel-head drafter.
    pipe = load(tiny_pair[0], SpeculativeConfig(method='parallel-head', model=str(tmp_path / "head")), warm_up=False)
    assert pipe.engine.drafter.name == "parallel-head"
    from foretell.kernels import lean_decode

    assert (pipe.engine.drafter.head.lean is not None) == (lean_decode() is not None)  # steps natively as its target
    from foretell.runtime.quant import Int8Linear

    # draft_quant "auto" keeps a float32 target's head as saved (tests/test_packed_step.py: int8 on a target with
    # 8-bit activations); "int8": int8 fuse and layers
    assert not isinstance(pipe.engine.drafter.head.fuse, Int8Linear)
    int8 = pipe.with_speculative(SpeculativeConfig(method='parallel-head', model=str(tmp_path / "head"),
                                                   draft_quant="int8"))
    assert isinstance(int8.engine.drafter.head.fuse, Int8Linear)
    from foretell.runtime.quant import Int4Linear

    int4 = pipe.with_speculative(SpeculativeConfig(method='parallel-head', model=str(tmp_path / "head"),
                                                   draft_quant="int4"))
    assert isinstance(int4.engine.drafter.head.fuse, Int4Linear)
    for prompt in PROMPTS:
        want = plain.engine.generate(prompt, GREEDY).tokens
        assert pipe.engine.generate(prompt, GREEDY).tokens == want
        assert int8.engine.generate(prompt, GREEDY).tokens == want
        assert int4.engine.generate(prompt, GREEDY).tokens == want


def test_lean_forward_matches_pytorch_and_decodes_exactly(plain):
    """The head's native forward (runtime/lean_drafters.LeanDraftLayers; fuse and its hot output rows in the column
    kernel, being bf16 numbers): context rows with placeholders, twice, give PyTorch's logits and cache up to
    rounding, and greedy decoding with it equals plain decoding."""
    from foretell.hot_vocab import HotVocab
    from foretell.kernels import lean_decode

    if lean_decode() is None:
        pytest.skip("the lean step's kernel cannot be built on this machine")
    target = plain.target.model
    config = ParallelHeadConfig.for_target(target.config, num_layers=2, fuse_layers=(0, 2))
    head = new_parallel_head(target, config, seed=3, hot=HotVocab(torch.arange(8, 40), 48))
    with torch.no_grad():  # the hot rows are the head's own copy; bf16 numbers, as a shipped head's weights are
        for weight in (head.fuse.weight, head.shared.lm_head.weight):
            weight.copy_(weight.bfloat16().float())
    assert use_lean_step(head) is None and head.lean.input_layer is not None and head.lean.output is not None
    lean = head.lean
    g = torch.Generator().manual_seed(0)
    features = torch.randn(7, len(config.fuse_layers) * config.hidden_size, generator=g)
    next_tokens = torch.tensor([3, 9, 11, 4, 20, 7, 1])
    results = {}
    for on in (True, False):
        head.lean = lean if on else None
        cache = head.new_cache(16)
        with torch.inference_mode():
            first = head(features[:5], next_tokens[:5], cache, num_placeholders=3, full_vocab=False)
            cache.commit_prefix(5)
            second = head(features[5:], next_tokens[5:], cache, num_placeholders=2)
        results[on] = (first, second, cache.k[:, :, :, :7].clone(), cache.v[:, :, :, :7].clone())
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    head.lean = lean
    spec = plain.with_drafter(ParallelHeadDrafter(head, HeadTreeShape(max_nodes=10, depth=4, width=3)))
    for prompt in PROMPTS:
        assert spec.engine.generate(prompt, GREEDY).tokens == plain.engine.generate(prompt, GREEDY).tokens
    assert use_lean_step(head, False) is None and head.lean is None


def test_load_errors(plain, tmp_path, tiny_pair):
    target = plain.target.model
    # Damaged folders in general: tests/test_module_folder.py. Here: this kind's own checks.
    # Heads for another target of the same sizes load; other sizes, or weights not matching the config, do not.
    other = load(tiny_pair[1], "none", warm_up=False).target.model  # same sizes: loads fine
    load_parallel_head(save_parallel_head(new_parallel_head(other), tmp_path / "o"), target)
    wide = ParallelHeadConfig.for_target(target.config)
    wide = ParallelHeadConfig(**{**wide.__dict__, "hidden_size": 32})
    with pytest.raises(ForetellError, match="built for a target with hidden size 32"):
        load_parallel_head(save_config_only(wide, tmp_path / "w"), target)
    two_layers = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, num_layers=2))
    save_parallel_head(two_layers, tmp_path / "two")
    (tmp_path / "two" / CONFIG_FILE).write_text((tmp_path / "o" / CONFIG_FILE).read_text())  # says 1 layer
    with pytest.raises(ForetellError, match="does not match"):
        load_parallel_head(tmp_path / "two", target)
    with pytest.raises(ForetellError, match="no parallel-head drafter is shipped for .*--head"):
        load(tiny_pair[0], SpeculativeConfig(method="parallel-head"), warm_up=False)
    # a head with its own vocabulary whose saved ids are damaged: the error names the file
    from safetensors.torch import load_file, save_file

    own = ParallelHeadConfig.for_target(target.config, draft_vocab_size=16)
    folder = save_parallel_head(new_parallel_head(target, own, draft_vocab=torch.arange(16) * 2), tmp_path / "own")
    state = load_file(str(folder / WEIGHTS_FILE))
    state["draft_vocab_ids"] = state["draft_vocab_ids"].flip(0)  # descending: not a vocabulary
    save_file(state, str(folder / WEIGHTS_FILE))
    with pytest.raises(ForetellError, match=f"{folder / WEIGHTS_FILE}: a parallel head's vocabulary needs 16 distinct"):
        load_parallel_head(folder, target)
    with pytest.raises(ForetellError, match="fuse_layers"):
        ParallelHeadConfig.for_target(target.config, fuse_layers=(1, 7))
    with pytest.raises(ForetellError, match="exceeds the parallel head's depth"):
        ParallelHeadDrafter(new_parallel_head(target), HeadTreeShape(depth=5))


def save_config_only(config: ParallelHeadConfig, folder):
    import json
    from dataclasses import asdict

    folder.mkdir()
    (folder / CONFIG_FILE).write_text(json.dumps({"format": "foretell-parallel-head", "version": 1, "config": asdict(config)}))
    (folder / WEIGHTS_FILE).write_bytes(b"")
    return folder


# --- the tree budget -----------------------------------------------------------------------


def brute_force_best(q: torch.Tensor, max_nodes: int, width: int) -> list[float]:
    """Scores of the max_nodes best nodes of the full width-ary tree of depth len(q)."""
    logq = torch.topk(q, width, dim=-1).values.log().tolist()
    scores = []
    for d in range(1, len(q) + 1):
        for ranks in itertools.product(range(width), repeat=d):
            scores.append(sum(logq[i][r] for i, r in enumerate(ranks)))
    return heapq.nlargest(max_nodes, scores)


@pytest.mark.parametrize("max_nodes, depth, width", [(16, 4, 3), (5, 4, 3), (40, 3, 2), (7, 1, 3), (10, 5, 1)])
def test_grow_tree_respects_caps_and_keeps_the_best_nodes(max_nodes, depth, width):
    q = torch.softmax(torch.randn(depth, 12, generator=torch.Generator().manual_seed(max_nodes)) * 2, -1)
    tokens, parents, _ = grow_tree(q, max_nodes, width)
    parents_t = torch.tensor(parents)
    assert len(tokens) == min(max_nodes, sum(width**d for d in range(1, depth + 1)))
    assert all(p < i for i, p in enumerate(parents)), "parents precede children"
    assert int(depths(parents_t).max()) <= depth
    for node in [-1, *range(len(tokens))]:
        children = [i for i, p in enumerate(parents) if p == node]
        assert len(children) <= width
        assert len({tokens[c] for c in children}) == len(children), "siblings are distinct tokens"
        d = 0 if node < 0 else int(depths(parents_t)[node])
        assert all(tokens[c] in torch.topk(q[d], width).indices.tolist() for c in children)
    score = [0.0] * len(tokens)
    for i, (t, p) in enumerate(zip(tokens, parents)):
        score[i] = (score[p] if p >= 0 else 0.0) + math.log(q[int(depths(parents_t)[i]) - 1, t])
    assert sorted(score, reverse=True) == pytest.approx(brute_force_best(q, max_nodes, width))


def test_grow_tree_skips_zero_probability_tokens():
    q = torch.tensor([[0.7, 0.3, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    tokens, parents, _ = grow_tree(q, 16, 3)
    assert tokens == [0, 0, 1, 0] and parents == [-1, 0, -1, 2]


def test_proposals_respect_the_budget_in_generation(plain):
    shape = HeadTreeShape(max_nodes=6, depth=3, width=2)
    params = SamplingParams(temperature=0.8, seed=1, max_new_tokens=30, ignore_eos=True)
    seen = recorded_proposals(with_head(plain, shape), PROMPTS[0], params)
    assert seen and all(p.size <= 6 and p.depth <= 3 for p in seen)
    assert any(p.size == 6 for p in seen)


def test_with_a_scheduler_it_drafts_only_what_the_scheduler_may_keep(plain):
    """The head runs placeholders only to the scheduler's depth cap and the tree grows only to its node cap
    (growth_limits), still exact."""
    target = plain.target.model
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config, depth=4))
    scheduler = AdaptiveTreeScheduler(CostCurve([1, 64], [0.01, 0.01], context=256))
    scheduler.growth_limits = lambda recent=8: (3, 2)
    spec = plain.with_drafter(ParallelHeadDrafter(head, HeadTreeShape(), scheduler))
    placeholders = []
    pass_rows = head.pass_rows  # the rows of the head's pass: the context, then the placeholders
    head.pass_rows = lambda features, tokens, count: placeholders.append(count) or pass_rows(features, tokens, count)
    seen = recorded_proposals(spec, PROMPTS[0], GREEDY)
    assert seen and all(p.size <= 3 and p.depth <= 2 for p in seen) and any(p.size for p in seen)
    assert placeholders and max(placeholders) <= 1
    assert_greedy_equals_plain(plain, spec)


# --- a briefly trained head ----------------------------------------------------------------


def test_a_briefly_trained_head_gets_accepted(plain):
    """60 steps on the target's own greedy continuations beat an untrained head's acceptance."""
    target = plain.target.model
    g = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(3, 48, (5,), generator=g).tolist() for _ in range(30)]
    seqs = [p + plain.engine.generate(p, GREEDY).tokens for p in prompts]
    train, held_out = torch.tensor(seqs[:24]), prompts[24:]
    torch.manual_seed(0)
    head = new_parallel_head(target)
    D = head.config.depth
    with torch.no_grad():
        hidden = target.forward_sequences(train[:, :-1], hidden_layers=head.config.fuse_layers, with_logits=False).hidden
    features, next_tokens = head.features(hidden), train[:, 1:]
    anchors = list(range(next_tokens.shape[1]))
    label_at = torch.tensor(anchors)[:, None] + 1 + torch.arange(1, D + 1)  # [A, D]: ids[a + 1 + d]
    valid = label_at < train.shape[1]
    labels = train[:, label_at.clamp(max=train.shape[1] - 1)][:, valid]
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    for _ in range(60):
        logits = head.forward_training(features, next_tokens, anchors)[:, valid]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def accepted(head):
        return accepted_drafts(plain, ParallelHeadDrafter(head), held_out)

    with torch.no_grad():
        trained, untrained = accepted(head), accepted(new_parallel_head(target))
    assert trained > untrained and trained > 0


def test_hot_vocabulary_head_drafts_only_hot_tokens_and_stays_exact(plain):
    """The drafter ranks over the head's hot columns and maps them back to token ids: only hot tokens are
    proposed, greedy output stays exact, and the tree is the one grown from the expanded full-vocabulary q."""
    from foretell.hot_vocab import HotVocab

    target = plain.target.model
    V = target.config.vocab_size
    hot = HotVocab(torch.arange(0, V, 3), V)  # every third token
    head = new_parallel_head(target, ParallelHeadConfig.for_target(target.config), seed=5, hot=hot)
    drafter = ParallelHeadDrafter(head, HeadTreeShape(max_nodes=10, depth=4, width=3))
    spec = plain.with_drafter(drafter)
    proposals = []
    steps = drafter.propose_steps  # what the engine calls

    def recorded(tokens, max_tokens):
        proposals.append((yield from steps(tokens, max_tokens)))
        return proposals[-1]

    drafter.propose_steps = recorded
    for prompt in PROMPTS:
        assert spec.engine.generate(prompt, GREEDY).tokens == plain.engine.generate(prompt, GREEDY).tokens
    hot_ids = set(hot.ids.tolist())
    assert sum(p.size for p in proposals) > 0 and all(set(p.tokens.tolist()) <= hot_ids for p in proposals)
    logits_hot = torch.randn(4, hot.size)
    tokens_hot, parents_hot, _ = grow_tree(torch.softmax(logits_hot, -1), 10, 3)
    tokens_full, parents_full, _ = grow_tree(torch.softmax(hot.expand(logits_hot), -1), 10, 3)
    assert hot.ids[torch.tensor(tokens_hot)].tolist() == tokens_full and parents_hot == parents_full
