"""Every supported decoder family against transformers (issue 25).

For each family: a tiny random model built with transformers' own classes from a configuration that switches the
family's features on, saved as a Hugging Face folder with the tiny tokenizer. Then, in fp32:
- foretell's logits match transformers' (eager attention) over a 24-token prompt, longer than the sliding
  window (8) where there is one: one forward, forwards of 7 / 1 / 8 tokens after a cache, and the cache-free
  batched forward used for training;
- 64 greedy tokens equal transformers' `generate`;
- speculative greedy decoding equals plain decoding with prompt lookup, a random parallel head, a random
  hidden-state draft (one target layer copied in) and a draft tree from a perturbed copy.
Past the window: a verified token tree and continuous batching (self-distillation data, the server) match
transformers; past the unscaled RoPE range, dynamic NTK and LongRoPE match its forward token by token.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers as tf

from conftest import make_tokenizer, perturbed_copy, save_model_folder
from foretell.api import load
from foretell.config import HeadTreeShape, HiddenStateOptions, SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models.config import ModelConfig
from foretell.models.hidden_draft import HiddenDraftConfig, new_hidden_draft, save_hidden_draft
from foretell.models.parallel_head import new_parallel_head, save_parallel_head
from foretell.models.transformer import Transformer
from foretell.types import SamplingParams

VOCAB, WINDOW, NEW = 48, 8, 64
# 24 tokens (3 windows) with repeats, so prompt lookup finds n-grams to propose.
PROMPT = [1, 5, 9, 12, 5, 9, 30, 7, 7, 20, 21, 22, 23, 20, 21, 22, 5, 9, 12, 40, 41, 5, 9, 12]
COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    initializer_range=0.3,  # peaked distributions, like a trained model's
)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 500000.0}
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
# Phi-3 / Phi-4-mini: LongRoPE (short factors up to position 32, long ones after) on 3/4 of each head.
PHI3_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
             "short_factor": [1.0, 1.2, 1.5, 1.1, 1.3, 1.05], "long_factor": [2.0, 3.0, 4.0, 2.5, 3.5, 5.0]}

# name: (config class, model class, configuration, the family flags foretell must read from it)
FAMILIES = {
    "llama3.1-rope": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_hidden_layers=2, rope_parameters=LLAMA3_ROPE),
                      {"rope_scaling"}),
    "llama-linear": (tf.LlamaConfig, tf.LlamaForCausalLM,
                     dict(num_hidden_layers=2, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}),
                     {"rope_scaling"}),
    # Dynamic NTK only changes positions past max_position_embeddings (32): the generated tokens.
    "llama-dynamic": (tf.LlamaConfig, tf.LlamaForCausalLM,
                      dict(num_hidden_layers=2, max_position_embeddings=32,
                           rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}),
                      {"rope_scaling"}),
    "llama-yarn": (tf.LlamaConfig, tf.LlamaForCausalLM,
                   dict(num_hidden_layers=2, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                              "original_max_position_embeddings": 32}),
                   {"rope_scaling"}),
    "mistral-swa": (tf.MistralConfig, tf.MistralForCausalLM, dict(num_hidden_layers=2, sliding_window=WINDOW),
                    {"sliding_window", "sliding_layers"}),
    "qwen2-swa": (tf.Qwen2Config, tf.Qwen2ForCausalLM,
                  dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
                  {"sliding_window", "sliding_layers"}),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM,
              dict(num_hidden_layers=3, head_dim=16, attention_bias=True, use_sliding_window=True,
                   sliding_window=WINDOW, max_window_layers=1),
              {"qk_norm", "o_proj_bias", "sliding_window", "sliding_layers"}),
    "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM, dict(num_hidden_layers=2, head_dim=16),
              {"hidden_act", "norm_offset", "embedding_scale"}),
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM,
               dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
               {"hidden_act", "norm_offset", "embedding_scale", "sandwich_norms", "attention_scale", "attn_softcap",
                "final_softcap", "sliding_window", "sliding_layers"}),
    "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM,
               dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                    rope_parameters=GEMMA3_ROPE, layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
               {"rope_scaling", "hidden_act", "qk_norm", "norm_offset", "embedding_scale", "sandwich_norms",
                "attention_scale", "sliding_window", "sliding_layers", "local_rope_theta"}),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM,
             dict(num_hidden_layers=2, sliding_window=WINDOW, original_max_position_embeddings=32, rope_parameters=PHI3_ROPE),
             {"rope_scaling", "rotary_dim", "sliding_window", "sliding_layers"}),
}
WINDOWED = [name for name, family in FAMILIES.items() if "sliding_window" in family[3]]


def build(name: str, seed: int = 0, **changes):
    config_class, model_class, extra, _ = FAMILIES[name]
    torch.manual_seed(seed)
    return model_class(config_class(**{**COMMON, **extra, **changes}, attn_implementation="eager")).eval()


def native_copy(hf_model, **changes) -> Transformer:
    cfg = replace(ModelConfig.from_hf_dict(hf_model.config.to_dict()), **changes)
    model = Transformer(cfg)
    model.load_hf_state_dict(dict(hf_model.state_dict()))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, transformers model, its folder, a plain foretell pipeline on the folder)."""
    name = request.param
    hf = build(name)
    folder = save_model_folder(tmp_path_factory.mktemp(name) / "target", hf, make_tokenizer(VOCAB))
    return name, hf, folder, load(folder, "none", warm_up=False)


def test_config_reads_the_family(family):
    name, _, _, plain = family
    assert set(plain.target.config.family_features()) == FAMILIES[name][3]


def test_logits_match_transformers(family):
    name, hf, _, plain = family
    model = plain.target.model
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        one = model(ids, torch.arange(len(ids)), model.new_cache(32)).logits
        cache, rows = model.new_cache(32), []
        for lo, hi in [(0, 7)] + [(i, i + 1) for i in range(7, 16)] + [(16, 24)]:
            rows.append(model(ids[lo:hi], torch.arange(lo, hi), cache).logits)
            cache.commit_prefix(hi - lo)
        batch = model.forward_sequences(torch.stack([ids, ids.flip(0)])).logits
        ref_flip = hf(ids.flip(0)[None]).logits[0]
    assert (one - ref).abs().max() < 1e-4
    assert (torch.cat(rows) - ref).abs().max() < 1e-4
    assert (batch[0] - ref).abs().max() < 1e-4 and (batch[1] - ref_flip).abs().max() < 1e-4
    if name in WINDOWED:  # the window bites over this prompt: without it the logits differ
        unwindowed = native_copy(hf, sliding_window=None, sliding_layers=())
        with torch.no_grad():
            assert (unwindowed(ids, torch.arange(len(ids)), unwindowed.new_cache(32)).logits - ref).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["mistral-swa", "gemma2", "gemma3"])
def test_tree_verification_matches_transformers_past_the_window(name):
    """A token tree verified after 20 committed tokens, windows of 8: each branch's logits equal transformers'
    over that branch alone (the tree mask and the window compose, in the SDPA and the soft-capped paths)."""
    hf = build(name)
    model = native_copy(hf)
    prefix = torch.tensor(PROMPT[:20])
    tokens, parents = torch.tensor([10, 11, 12, 13, 14]), [-1, 0, 0, 2, 3]
    depth, mask = [0] * 5, torch.zeros(5, 5, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i], depth[i] = mask[parent], depth[parent] + 1
        mask[i, i] = True
    with torch.no_grad():
        cache = model.new_cache(32)
        model(prefix, torch.arange(20), cache)
        cache.commit_prefix(20)
        out = model(tokens, 20 + torch.tensor(depth), cache, tree_mask=mask).logits
        for path in ([0, 1], [0, 2, 3, 4]):
            ref = hf(torch.cat([prefix, tokens[path]])[None]).logits[0, 20:]
            assert (out[path] - ref).abs().max() < 1e-4


def hf_greedy(hf, prompt: list[int], new: int) -> list[int]:
    hf.generation_config.eos_token_id = None  # run the full length, like ignore_eos
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                      do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_greedy_stepwise(hf, prompt: list[int], new: int) -> list[int]:
    """Greedy decoding with transformers' forward and its cache, one token a forward after the prompt."""
    from transformers import DynamicCache

    cache, out, tokens = DynamicCache(config=hf.config), None, []
    out = hf(torch.tensor([prompt]), past_key_values=cache, use_cache=True)
    for position in range(len(prompt), len(prompt) + new):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = hf(torch.tensor([tokens[-1:]]), past_key_values=cache, use_cache=True, position_ids=torch.tensor([[position]]))
    return tokens


GREEDY = SamplingParams(max_new_tokens=NEW, ignore_eos=True)


def test_greedy_matches_transformers(family):
    """Against `generate`, except Phi-3 with LongRoPE: there `generate` recomputes the whole cache with the long
    factors once the sequence passes original_max_position_embeddings (Phi3ForCausalLM.prepare_inputs_for_generation),
    where foretell, like transformers' own forward with a cache, keeps each position's rotation (rope.py)."""
    name, hf, _, plain = family
    with torch.no_grad():
        expected = (hf_greedy_stepwise if name == "phi3" else hf_greedy)(hf, PROMPT, NEW)
    assert plain.engine.generate(PROMPT, GREEDY).tokens == expected


@pytest.mark.parametrize("name", ["phi3", "llama-dynamic"])
def test_positions_past_the_unscaled_range_match_transformers(name):
    """LongRoPE past original_max_position_embeddings and dynamic NTK past max_position_embeddings (both 32):
    each new position's logits equal transformers' forward with a cache, token by token, to position 79."""
    from transformers import DynamicCache

    hf = build(name)
    model = native_copy(hf)
    ids = torch.randint(3, VOCAB, (80,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache, mine = model.new_cache(80), []
        hf_cache = DynamicCache(config=hf.config)
        ref = [hf(ids[None, :24], past_key_values=hf_cache, use_cache=True).logits[0]]
        mine.append(model(ids[:24], torch.arange(24), cache).logits)
        cache.commit_prefix(24)
        for p in range(24, 80):
            ref.append(hf(ids[None, p : p + 1], past_key_values=hf_cache, use_cache=True,
                          position_ids=torch.tensor([[p]])).logits[0])
            mine.append(model(ids[p : p + 1], torch.tensor([p]), cache).logits)
            cache.commit_prefix(1)
    assert (torch.cat(mine) - torch.cat(ref)).abs().max() < 1e-4


def test_speculative_greedy_equals_plain(family, tmp_path):
    _, hf, _, plain = family
    target = plain.target.model
    head = save_parallel_head(new_parallel_head(target, seed=1), tmp_path / "head")
    hidden_config = HiddenDraftConfig.for_target(target.config, token_info_rank=8)
    hidden = save_hidden_draft(new_hidden_draft(target, hidden_config, seed=2, init_from_layer=0), tmp_path / "hidden")
    draft = save_model_folder(tmp_path / "draft", perturbed_copy(hf, noise=0.3, seed=3), make_tokenizer(VOCAB))
    configs = {
        "prompt-lookup": SpeculativeConfig(method="prompt-lookup"),
        "parallel-head": SpeculativeConfig(method="parallel-head", model=str(head), head_tree=HeadTreeShape(8, 3, 2)),
        "hidden-state": SpeculativeConfig(method="hidden-state", model=str(hidden),
                                          hidden=HiddenStateOptions(resample_when="always")),
        "draft-tree": SpeculativeConfig(method="draft-tree", model=str(draft)),
    }
    expected = plain.engine.generate(PROMPT, GREEDY).tokens
    for method, spec in configs.items():
        result = plain.with_speculative(spec).engine.generate(PROMPT, GREEDY)
        assert result.tokens == expected, method
        assert result.stats.draft_tokens_verified > 0, method


@pytest.mark.parametrize("name", ["mistral-swa", "gemma2", "gemma3"])
def test_batched_generation_matches_transformers_past_the_window(name, tmp_path):
    """Continuous batching (packed passes of two requests drafted by prompt lookup, as self-distillation data and
    the server decode) past the window."""
    hf = build(name)
    folder = save_model_folder(tmp_path / "target", hf, make_tokenizer(VOCAB))
    pipe = load(folder, "prompt-lookup", warm_up=False)
    prompts, outs = [PROMPT, PROMPT[5:]], {}
    batch = pipe.batch_engine(max_batch=2)
    for i, prompt in enumerate(prompts):
        batch.submit(prompt, SamplingParams(max_new_tokens=12, ignore_eos=True),
                     lambda chunk, i=i: outs.update({i: chunk.result.tokens}) if chunk.result else None, pytest.fail)
    batch.run()
    with torch.no_grad():
        assert [outs[0], outs[1]] == [hf_greedy(hf, prompt, 12) for prompt in prompts]


def test_unsupported_configurations_say_what_is_missing():
    base = {k: v for k, v in COMMON.items() if k != "initializer_range"} | {"num_hidden_layers": 2}
    cases = [
        ({"model_type": "mixtral", "num_local_experts": 8}, "mixture-of-experts"),
        ({"model_type": "qwen3_moe"}, "mixture-of-experts"),
        ({"model_type": "gemma3", "text_config": {}, "vision_config": {}}, "multimodal wrapper"),
        ({"model_type": "falcon"}, "'falcon' is not supported; foretell runs llama"),
        ({"model_type": "llama", "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}}, "'proportional'"),
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "bidirectional"),
        ({"model_type": "llama", "hidden_act": "relu"}, "activation 'relu'"),
    ]
    for changes, message in cases:
        with pytest.raises(ForetellError, match=message):
            ModelConfig.from_hf_dict(base | changes)


def test_saving_a_family_model_as_a_folder_is_refused_clearly(tmp_path):
    from foretell.models.derive import save_model_folder as save_native

    model = native_copy(build("gemma2"))
    with pytest.raises(ForetellError, match="saving a gemma2 model .* Llama / Qwen2 configurations only"):
        save_native(model, make_tokenizer(VOCAB), tmp_path / "out")
    assert not (tmp_path / "out.partial").exists()
