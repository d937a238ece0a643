"""Smaller models derived from a target, sharing its tokenizer (a draft where no family member exists),
and saving any native model as a Hugging Face folder that both foretell and transformers load."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from foretell.errors import ForetellError
from foretell.files import readable_as_umask_allows
from foretell.models.config import ModelConfig
from foretell.models.transformer import Transformer

MODEL_FILE = "model.safetensors"


def truncated_copy(target: Transformer, num_layers: int) -> Transformer:
    """The target's embedding, first `num_layers` decoder layers, final norm and output layer."""
    if not 1 <= num_layers <= target.config.num_hidden_layers:
        raise ValueError(f"num_layers must be in 1..{target.config.num_hidden_layers}, got {num_layers}")
    config = replace(target.config, num_hidden_layers=num_layers)
    draft = Transformer(config).to(device=target.device, dtype=target.dtype)
    keep = {k: v for k, v in target.state_dict().items() if not k.startswith("layers.") or int(k.split(".")[1]) < num_layers}
    draft.load_state_dict(keep, strict=not config.tie_word_embeddings)
    if config.tie_word_embeddings:
        draft.lm_head.weight = draft.embed_tokens.weight
    return draft.eval().requires_grad_(False)


@dataclass(frozen=True)
class DraftShape:
    """The size of a randomly initialised draft; None copies the target's value."""

    num_layers: int
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    init_std: float = 0.02  # transformers' initializer_range for Llama/Qwen2


def draft_from_config(target: Transformer, shape: DraftShape, seed: int = 0, copy_embeddings: bool = True) -> Transformer:
    """A fresh draft with the target's vocabulary, special ids and RoPE, sized by `shape`.

    With `copy_embeddings` and an equal hidden size, the target's embedding, output layer and
    final norm are copied: the vocabulary layers are most of a small draft's parameters, and the
    target's are already good.
    """
    t = target.config
    hidden = shape.hidden_size or t.hidden_size
    heads = shape.num_attention_heads or (t.num_attention_heads if hidden == t.hidden_size else max(1, hidden // 64))
    kv_heads = shape.num_key_value_heads or (t.num_key_value_heads if heads == t.num_attention_heads else heads)
    if hidden % heads or heads % kv_heads or shape.num_layers < 1:
        raise ValueError(f"bad draft shape {shape}: need layers >= 1, hidden % heads == 0 and heads % kv_heads == 0")
    config = replace(
        t, num_hidden_layers=shape.num_layers, hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=hidden // heads,
        intermediate_size=shape.intermediate_size or (t.intermediate_size * hidden // t.hidden_size),
    )
    g = torch.Generator().manual_seed(seed)
    draft = Transformer(config)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0 - config.norm_offset)  # a scale of 1 (Gemma's norms scale by offset + weight)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * shape.init_std)
        if copy_embeddings and hidden == t.hidden_size:
            draft.embed_tokens.weight.copy_(target.embed_tokens.weight)
            draft.lm_head.weight.copy_(target.lm_head.weight)  # a no-op when tied
            draft.norm.weight.copy_(target.norm.weight)
    return draft.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)


def hf_config_dict(config: ModelConfig, dtype: torch.dtype) -> dict:
    """config.json for transformers. Qwen2 in transformers always has q/k/v biases and Llama's
    `attention_bias` would add one to o_proj too, so the model type follows the bias.
    Only Llama / Qwen2 models are written: other families' features have no place in these configs."""
    if config.family_features():
        raise ForetellError(
            f"saving a {config.model_type} model as a Hugging Face folder is not supported: foretell writes Llama / "
            f"Qwen2 configurations only, and this one has {', '.join(config.family_features())}"
        )
    model_type = "qwen2" if config.attention_bias else "llama"
    eos = list(config.eos_token_ids)
    return {
        "architectures": ["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "dtype": str(dtype).removeprefix("torch."),
    }


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights in transformers' naming: fused projections split back apart."""
    c = model.config
    q_dim, kv_dim = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        for n, w in zip("qkv", layer.qkv_proj.weight.split((q_dim, kv_dim, kv_dim))):
            out[p + f"self_attn.{n}_proj.weight"] = w
        if c.attention_bias:
            for n, b in zip("qkv", layer.qkv_proj.bias.split((q_dim, kv_dim, kv_dim))):
                out[p + f"self_attn.{n}_proj.bias"] = b
        out[p + "self_attn.o_proj.weight"] = layer.o_proj.weight
        gate, up = layer.gate_up_proj.weight.chunk(2, dim=0)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = layer.down_proj.weight
        out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def save_model_folder(model: Transformer, tokenizer, path: str | Path, extra: dict | None = None) -> Path:
    """Write config.json + model.safetensors + tokenizer files, atomically (a folder that exists is whole).

    `extra` goes to foretell-model.json (provenance: how the model was made)."""
    path = Path(path)
    config = hf_config_dict(model.config, model.dtype)  # refuses unsupported families before writing anything
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_file(hf_state_dict(model), str(tmp / MODEL_FILE), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(tmp))
    if extra is not None:
        (tmp / "foretell-model.json").write_text(json.dumps(extra, indent=2))
    readable_as_umask_allows(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path
