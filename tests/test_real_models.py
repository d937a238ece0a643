"""Real models from packages: SmolLM2-135M (default run, skipped if absent) and the Qwen pair (slow).

Greedy speculative output must equal plain greedy token for token in fp32 on Spec-Bench prompts.
"""

import pytest
import torch

from conftest import spec_bench_prompts
from foretell.api import load
from foretell.config import SpeculativeConfig, TreeShape
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.draft_tree import DraftTreeDrafter
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.models.derive import truncated_copy
from foretell.models.presets import PRESETS, preset_available
from foretell.types import SamplingParams


def require(*names):
    missing = [n for n in names if not preset_available(n)]
    if missing:
        cmds = "; ".join(PRESETS[n].install_command for n in missing)
        pytest.skip(f"model preset(s) {', '.join(missing)} not installed ({cmds})")


@pytest.fixture(scope="module")
def smollm():
    require("smollm2-135m")
    torch.set_num_threads(2)
    yield load("smollm2-135m", "none", dtype="float32")
    torch.set_num_threads(1)


def test_smollm_logits_match_transformers(smollm):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(smollm.target.path), dtype=torch.float32).eval()
    ids = torch.tensor(smollm.encode(spec_bench_prompts(1)[0]))
    with torch.no_grad():
        expected = ref(ids[None]).logits[0]
        got = smollm.target.model(ids, torch.arange(len(ids)), smollm.target.model.new_cache(len(ids))).logits
    assert (got - expected).abs().max() < 1e-3


def test_smollm_greedy_speculation_is_exact(smollm):
    params = SamplingParams(max_new_tokens=32)
    small = truncated_copy(smollm.target.model, 10)
    vocab = smollm.target.config.vocab_size
    drafters = {
        "prompt-lookup": PromptLookupDrafter(),
        "draft-model": DraftModelDrafter(small, vocab),
        "draft-tree": DraftTreeDrafter(small, vocab, TreeShape(depth=4, top_k=3, total_tokens=12)),
    }
    prompts = spec_bench_prompts(1)[:5]
    accepted = {name: 0 for name in drafters}
    for prompt in prompts:
        ids = smollm.encode(prompt)
        plain = smollm.engine.generate(ids, params).tokens
        for name, drafter in drafters.items():
            result = smollm.with_drafter(drafter, gamma=4).engine.generate(ids, params)
            assert result.tokens == plain, f"{name} diverged on {prompt[:60]!r}"
            accepted[name] += sum(result.stats.accepted_per_position)
    assert all(accepted.values()), accepted  # both drafters really contributed tokens


@pytest.mark.slow
def test_qwen_pair_greedy_speculation_is_exact():
    require("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    torch.set_num_threads(2)
    # int8 draft weights, as the CLI's default on CPU: the output must not change.
    spec = load("qwen2.5-coder-1.5b", SpeculativeConfig(method='draft-model', model="qwen2.5-coder-0.5b", gamma=4, draft_quant="int8"), dtype="float32")
    plain = spec.with_drafter(None)
    lookup = spec.with_drafter(PromptLookupDrafter())
    tree = spec.with_drafter(DraftTreeDrafter(spec.engine.drafter.model, spec.target.config.vocab_size, TreeShape()))
    params = SamplingParams(max_new_tokens=32)
    for prompt in spec_bench_prompts(1)[:5]:
        ids = spec.encode(prompt)
        expected = plain.engine.generate(ids, params).tokens
        assert spec.engine.generate(ids, params).tokens == expected
        assert lookup.engine.generate(ids, params).tokens == expected
        assert tree.engine.generate(ids, params).tokens == expected
