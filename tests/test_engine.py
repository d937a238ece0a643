"""End-to-end on tiny models: greedy speculative output equals plain greedy, for every drafter."""

import pytest

from conftest import PROMPTS, greedy_params
from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.types import SamplingParams

GREEDY = greedy_params()


def plain_tokens(pipe, prompt):
    return pipe.engine.generate(prompt, GREEDY).tokens


@pytest.mark.parametrize("policy", ["fixed", "rejection-rate", "additive"])
@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_draft_model_greedy_equals_plain(tiny_pair, plain, policy, gamma):
    target, draft = tiny_pair
    spec = load(target, SpeculativeConfig(method='draft-model', model=str(draft), gamma=gamma, length_policy=policy, draft_quant="none"))
    accepted_any = rejected_any = False
    for prompt in PROMPTS:
        result = spec.engine.generate(prompt, GREEDY)
        assert result.tokens == plain_tokens(plain, prompt)
        stats = result.stats
        assert stats.target_passes < stats.new_tokens or gamma == 1
        accepted_any |= sum(stats.accepted_per_position) > 0
        rejected_any |= sum(stats.accepted_per_position) < sum(stats.proposed_per_position)
    assert accepted_any and rejected_any, "the test pair should exercise both outcomes"


def test_prompt_lookup_greedy_equals_plain(plain):
    lookup = plain.with_drafter(PromptLookupDrafter(), gamma=5)
    for prompt in PROMPTS:
        assert lookup.engine.generate(prompt, GREEDY).tokens == plain_tokens(plain, prompt)


def test_target_as_its_own_draft_accepts_everything(tiny_pair, plain):
    """All drafts pass, so every step ends with a bonus token (gamma + 1 tokens a pass)."""
    target, _ = tiny_pair
    self_draft = plain.with_drafter(DraftModelDrafter(load(target, "none").target.model, 48), gamma=4)
    result = self_draft.engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=21, ignore_eos=True))
    assert result.tokens == plain_tokens(plain, PROMPTS[0])[:21]
    assert result.stats.acceptance_rate == 1.0
    assert result.stats.target_passes == 5  # 4 passes of 5 tokens + 1 pass for the last token
    assert result.stats.proposed_per_position == [4, 4, 4, 4]
    assert result.stats.tau == 21 / 5


def test_sampling_is_reproducible_with_a_seed(tiny_pair):
    target, draft = tiny_pair
    spec = load(target, SpeculativeConfig(method='draft-model', model=str(draft), draft_quant="none"))
    params = SamplingParams(temperature=0.8, top_k=20, seed=123, max_new_tokens=30, ignore_eos=True)
    a = spec.engine.generate(PROMPTS[0], params).tokens
    b = spec.engine.generate(PROMPTS[0], params).tokens
    c = spec.engine.generate(PROMPTS[0], SamplingParams(**{**params.__dict__, "seed": 124})).tokens
    assert a == b and a != c


def test_stops_on_eos_and_length(plain):
    eos = plain.engine.stop_ids
    result = plain.engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=7, ignore_eos=True))
    assert len(result.tokens) == 7 and result.stats.finish_reason == "length"
    # Make the first greedy token an end-of-sequence id: generation must stop with nothing emitted.
    first = result.tokens[0]
    plain.engine.stop_ids = {first}
    try:
        stopped = plain.engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=7))
    finally:
        plain.engine.stop_ids = eos
    assert stopped.tokens == [] and stopped.stats.finish_reason == "stop"


def test_stop_string_truncates_text_and_stream_matches(plain):
    full = plain.engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=20, ignore_eos=True))
    words = full.text.split()
    stop = words[3]
    cut = full.text[: full.text.find(stop)]
    chunks = list(plain.engine.stream(PROMPTS[0], SamplingParams(max_new_tokens=20, ignore_eos=True, stop=(stop,))))
    result = chunks[-1].result
    assert result.text == cut and result.stats.finish_reason == "stop"
    assert "".join(c.text for c in chunks) == cut


def test_streamed_text_equals_final_text(tiny_pair):
    target, draft = tiny_pair
    spec = load(target, SpeculativeConfig(method='draft-model', model=str(draft), draft_quant="none"))
    chunks = list(spec.engine.stream(PROMPTS[1], SamplingParams(max_new_tokens=25, ignore_eos=True)))
    assert all(c.result is None for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == chunks[-1].result.text
    assert sum(len(c.tokens) for c in chunks) == 25


def test_context_window_limits_generation(plain):
    window = plain.engine.context_window
    prompt = [1] + [5] * (window - 3)
    result = plain.engine.generate(prompt, SamplingParams(max_new_tokens=50, ignore_eos=True))
    assert len(result.tokens) == 2 and result.stats.finish_reason == "length"


def test_chat_prompt_uses_template(plain):
    ids = plain.encode("w3 w4")
    text = plain.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>") and "w3 w4" in text and text.count("<|im_start|>") == 2
    assert plain.encode("w3 w4", chat=False) == plain.tokenizer("w3 w4", add_special_tokens=False)["input_ids"]


TREE_SHAPES = {
    "static-topk": dict(kind="static", branching=(3, 2, 1, 1)),
    "static-sampled": dict(kind="static", branching=(2, 2, 1), children="sampled"),
    "dynamic": dict(kind="dynamic", depth=5, top_k=3, total_tokens=12),
}


@pytest.mark.parametrize("shape", list(TREE_SHAPES))
def test_tree_drafter_greedy_equals_plain(tiny_pair, plain, shape):
    from foretell.drafters.draft_tree import DraftTreeDrafter
    from foretell.config import TreeShape

    target, draft = tiny_pair
    draft_model = load(draft, "none").target.model
    tree = plain.with_drafter(DraftTreeDrafter(draft_model, 48, TreeShape(**TREE_SHAPES[shape])))
    chain = plain.with_drafter(DraftModelDrafter(draft_model, 48), gamma=4)
    tree_tau = chain_tau = 0.0
    for prompt in PROMPTS:
        expected = plain_tokens(plain, prompt)
        result = tree.engine.generate(prompt, GREEDY)
        assert result.tokens == expected
        tree_tau += result.stats.tau
        chain_tau += chain.engine.generate(prompt, GREEDY).stats.tau
    assert tree_tau > chain_tau  # more candidates per depth: more accepted per pass


def test_dynamic_tree_respects_budget_and_topology(tiny_pair):
    from foretell.drafters.draft_tree import DraftTreeDrafter
    from foretell.config import TreeShape
    from foretell.tree import check_parents

    _, draft = tiny_pair
    drafter = DraftTreeDrafter(load(draft, "none").target.model, 48, TreeShape(depth=4, top_k=3, total_tokens=7))
    drafter.start(PROMPTS[0], 64, SamplingParams(), None)
    proposal = drafter.propose(PROMPTS[0], 10)
    assert proposal.size == 7 and proposal.q is None
    check_parents(proposal.parents)
    assert drafter.cache.length == len(PROMPTS[0])  # the grown tree left the draft cache
