"""Typed configuration of the decoder-only transformers foretell runs natively (Llama, Qwen2)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from foretell.errors import ForetellError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False  # Qwen2 has biases on q, k, v
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    bos_token_id: int | None = None

    @classmethod
    def from_hf_dict(cls, raw: dict) -> "ModelConfig":
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ForetellError(
                f"model type {model_type!r} is not supported; foretell runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ForetellError(f"rope scaling {rope_type!r} is not supported yet (only the default RoPE)")
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        heads = raw["num_attention_heads"]
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            attention_bias=bool(raw.get("attention_bias", model_type == "qwen2")),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            model_type=model_type,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
        )

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ForetellError(f"no config.json at {path}: point at a Hugging Face model folder") from None
        except json.JSONDecodeError as e:
            raise ForetellError(f"{path} is not valid JSON ({e}); re-create or re-convert the model") from None
        return cls.from_hf_dict(raw)

    def to_dict(self) -> dict:
        return asdict(self)
