"""GGUF files of the supported families: tiny random models written the way llama.cpp's converter writes them
(its tensor names, q/k permutation for Llama, Gemma's norms + 1, RoPE scaling as metadata or factor tensors),
loaded through foretell's GGUF path (transformers' reader plus gguf_meta's corrections), against the original
transformers model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from foretell.errors import ForetellError
from foretell.runtime.loading import load_model
from gguf_blocks import quantize
from test_families import LLAMA3_ROPE, PROMPT, VOCAB, WINDOW, build

gguf = pytest.importorskip("gguf")


def llama3_rope_freqs(head_dim: int, p: dict) -> list[float]:
    """The per-dimension divisors llama.cpp's converter writes as rope_freqs for Llama 3.1 scaling."""
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * p["rope_theta"] ** (i / head_dim)
        old = p["original_max_position_embeddings"]
        if wavelen < old / p["high_freq_factor"]:
            factors.append(1.0)
        elif wavelen > old / p["low_freq_factor"]:
            factors.append(p["factor"])
        else:
            smooth = (old / wavelen - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / p["factor"] + smooth))
    return factors


def write_gguf(hf, arch: str, path, name: str = "tiny", metadata=lambda writer: None, tensors: dict | None = None,
               q4_1=lambda hf_name: False, q8_0=lambda hf_name: False, blocks=lambda hf_name: None):
    """A GGUF of `hf` with a word-level gpt2-type vocabulary (token ids as in conftest.make_tokenizer): F32, but
    Q4_1 for the tensors q4_1(name) picks, Q8_0 for those q8_0(name) picks, and the block type blocks(name) names
    where it names one (gguf_blocks.quantize)."""
    c = hf.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters.get("full_attention") or c.rope_parameters
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(["<unk>", "<|im_start|>", "<|im_end|>"] + [f"w{i}" for i in range(VOCAB - 3)])
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (VOCAB - 3))
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    metadata(w)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), c.num_hidden_layers)
    for hf_name, t in hf.state_dict().items():
        if "rotary_emb" in hf_name or (hf_name == "lm_head.weight" and c.tie_word_embeddings):
            continue
        t = t.detach().float().numpy()
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's q/k layout
            heads = c.num_attention_heads if "q_proj" in hf_name else c.num_key_value_heads
            t = t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):  # llama.cpp stores Gemma's 1 + w
            t = t + 1
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        kind = blocks(hf_name) or (gguf.GGMLQuantizationType.Q4_1 if q4_1(hf_name) else
                                   gguf.GGMLQuantizationType.Q8_0 if q8_0(hf_name) else None)
        if kind is not None:
            w.add_tensor(gguf_name, quantize(t, kind), raw_dtype=kind)
        else:
            w.add_tensor(gguf_name, np.ascontiguousarray(t))
    for tensor_name, values in (tensors or {}).items():
        w.add_tensor(tensor_name, np.asarray(values, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def phi3_metadata(hf):
    rope = hf.config.rope_parameters

    def add(w):
        w.add_sliding_window(WINDOW)
        w.add_rope_dimension_count(int(64 // 4 * rope["partial_rotary_factor"]))  # hidden 64, 4 heads
        w.add_rope_scaling_orig_ctx_len(hf.config.original_max_position_embeddings)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(128 / 32) / math.log(32)))
    return add


CASES = {
    # name: (family in test_families, its changes, GGUF architecture, general.name, metadata, extra tensors)
    "llama3.1": ("llama3.1-rope", {}, "llama", "tiny", lambda hf: lambda w: None,
                 lambda hf: {"rope_freqs.weight": llama3_rope_freqs(hf.config.head_dim, LLAMA3_ROPE)}),
    # llama.cpp writes Mistral models with the llama architecture and no sliding window (it attends fully), and
    # so do they load: as Llama, without a window (the config check below).
    "mistral": ("mistral-swa", {"sliding_window": None}, "llama", "Mistral 7B Instruct tiny", lambda hf: lambda w: None,
                lambda hf: {}),
    "qwen2": ("qwen2-swa", {"use_sliding_window": False}, "qwen2", "tiny", lambda hf: lambda w: None, lambda hf: {}),
    # transformers' reader takes Qwen3's head_dim from its default (128, as in every Qwen3), not the metadata.
    "qwen3": ("qwen3", {"head_dim": 128, "use_sliding_window": False}, "qwen3", "tiny", lambda hf: lambda w: None,
              lambda hf: {}),
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 256}, "gemma2", "tiny",
               lambda hf: lambda w: (w.add_sliding_window(WINDOW), w.add_attn_logit_softcapping(5.0),
                                     w.add_final_logit_softcapping(3.0)), lambda hf: {}),
    "gemma3": ("gemma3", {"query_pre_attn_scalar": 256}, "gemma3", "tiny",
               lambda hf: lambda w: (w.add_sliding_window(WINDOW), w.add_sliding_window_pattern(2),
                                     w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR), w.add_rope_scaling_factor(8.0)),
               lambda hf: {}),
    "phi3": ("phi3", {}, "phi3", "tiny", phi3_metadata,
             lambda hf: {"rope_factors_long.weight": hf.config.rope_parameters["long_factor"],
                         "rope_factors_short.weight": hf.config.rope_parameters["short_factor"]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_loads_to_the_same_model(case, tmp_path):
    family, changes, arch, name, metadata, tensors = CASES[case]
    hf = build(family, **changes)
    path = write_gguf(hf, arch, tmp_path / f"{case}.gguf", name, metadata(hf), tensors(hf))
    loaded = load_model(path, cache_dir=tmp_path / "cache")
    assert loaded.config.sliding_window == getattr(hf.config, "sliding_window", None)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        out = loaded.model(ids, torch.arange(len(ids)), loaded.model.new_cache(32)).logits
    assert (out - ref).abs().max() < 1e-4


def test_unsupported_gguf_architectures_are_refused_before_conversion(tmp_path):
    for arch, message in (("falcon", "'falcon' in x.gguf is not supported; foretell loads GGUF files of llama"),
                          ("qwen3moe", "mixture-of-experts")):
        w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), arch)
        w.add_block_count(1)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(ForetellError, match=message):
            load_model(tmp_path / "x.gguf", cache_dir=tmp_path / "cache")
        assert not list((tmp_path / "cache").rglob("*.safetensors"))
