"""Typed configuration of the decoder-only transformers foretell runs natively.

One decoder (transformer.py) covers every supported family through the flags below; each flag's default is
Llama's, i.e. the feature off. `from_hf_dict` reads a Hugging Face config.json through transformers' own
configuration class for its model type, so legacy keys (rope_scaling, rope_local_base_freq, use_sliding_window,
sliding_window_pattern, ...) and defaults mean exactly what they mean there, then maps the family onto flags.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from foretell.errors import ForetellError
from foretell.models.rope import RopeScaling

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")
# Activations the MLP implements (transformers' ACT2FN names); "gelu" is the exact (erf) GELU.
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh")
# Keys whose presence marks a mixture-of-experts configuration, whatever its model type.
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
SLIDING, FULL = "sliding_attention", "full_attention"


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
    attention_bias: bool = False  # biases on q, k, v (Qwen2; Llama / Qwen3 / Gemma `attention_bias`)
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    bos_token_id: int | None = None
    # --- family features; every default is Llama's (off) ---
    rope_scaling: RopeScaling | None = None  # llama3 / linear / dynamic / yarn / longrope (rope.py); None = default
    rotary_dim: int | None = None  # rotate only the first rotary_dim dims of a head (partial_rotary_factor); None = all
    o_proj_bias: bool = False  # Llama / Qwen3 / Gemma `attention_bias` biases the output projection too
    mlp_bias: bool = False  # Llama's mlp_bias
    hidden_act: str = "silu"  # the MLP gate's activation: Gemma uses gelu_pytorch_tanh
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head of q and k, before RoPE
    norm_offset: float = 0.0  # Gemma: every RMSNorm scales by (offset + weight), multiplied in fp32
    embedding_scale: float | None = None  # Gemma: embeddings times sqrt(hidden_size), rounded to the model dtype
    sandwich_norms: bool = False  # Gemma 2 / 3: RMSNorms on the attention and MLP outputs too
    attention_scale: float | None = None  # Gemma 2 / 3: query_pre_attn_scalar ** -0.5; None = head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap) before the softmax
    final_softcap: float | None = None  # Gemma 2: the same on the output logits
    sliding_window: int | None = None  # a query at position p sees keys at positions > p - sliding_window ...
    sliding_layers: tuple[int, ...] = ()  # ... in these layers (Mistral, Phi-3: all; Gemma 2 / 3: alternating)
    local_rope_theta: float | None = None  # Gemma 3: the sliding layers' own (default) RoPE base

    def __post_init__(self):
        object.__setattr__(self, "sliding_layers", tuple(int(i) for i in self.sliding_layers))
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
        if isinstance(self.rope_scaling, dict):  # a config read back from JSON (to_dict)
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.sliding_layers and not self.sliding_window:
            raise ForetellError("sliding_layers need a sliding_window")
        if self.hidden_act not in ACTIVATIONS:
            raise ForetellError(f"hidden activation {self.hidden_act!r} is not supported; foretell runs {', '.join(ACTIVATIONS)}")
        if self.rotary_dim is not None and (self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim):
            raise ForetellError(f"rotary_dim must be even and in 1..head_dim ({self.head_dim}), got {self.rotary_dim}")

    @property
    def context_window(self) -> int:
        """Positions the model covers: max_position_embeddings, which dynamic NTK scaling stretches by its
        factor (transformers reads max_position_embeddings as the unscaled length for that type only)."""
        scaling = self.rope_scaling
        if scaling is not None and scaling.rope_type == "dynamic":
            return int(self.max_position_embeddings * scaling.factor)
        return self.max_position_embeddings

    @property
    def rope_dim(self) -> int:
        """The rotated width of each head."""
        return self.rotary_dim or self.head_dim

    def drafter_layers(self, **sizes) -> "ModelConfig":
        """The config of a drafter's own decoder layers for this target: `sizes` replaced, the family's layer
        features kept (so a target layer's weights fit them), positional ones dropped (drafters build their
        own RoPE tables and masks)."""
        return replace(
            self, rope_scaling=None, rotary_dim=None, sliding_window=None, sliding_layers=(), local_rope_theta=None,
            **sizes,
        )

    def family_features(self) -> list[str]:
        """The family flags set away from Llama's defaults (attention_bias aside: Qwen2 has it)."""
        first = [f.name for f in fields(self)].index("rope_scaling")
        return [f.name for f in fields(self)[first:] if getattr(self, f.name) != f.default]

    @classmethod
    def from_hf_dict(cls, raw: dict) -> "ModelConfig":
        model_type = raw.get("model_type", "llama")
        check_supported(raw, model_type)
        hf = _transformers_config(raw, model_type)
        gemma = model_type.startswith("gemma")
        sandwich = model_type in ("gemma2", "gemma3_text")
        heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        rope, local_theta = _rope_parameters(hf, model_type)
        partial = rope.get("partial_rotary_factor") or 1.0
        window, sliding = _sliding(hf, model_type)
        bias = True if model_type == "qwen2" else bool(getattr(hf, "attention_bias", False))
        eos = hf.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        return cls(
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_hidden_layers=hf.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            max_position_embeddings=hf.max_position_embeddings,
            rms_norm_eps=hf.rms_norm_eps,
            rope_theta=float(rope["rope_theta"]),
            attention_bias=bias,
            tie_word_embeddings=bool(hf.tie_word_embeddings),
            model_type=model_type,
            eos_token_ids=eos_ids,
            bos_token_id=hf.bos_token_id,
            rope_scaling=RopeScaling.from_hf(rope),
            rotary_dim=int(head_dim * partial) if partial != 1.0 else None,
            o_proj_bias=bias and model_type != "qwen2",
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            hidden_act=(getattr(hf, "hidden_activation", None) if sandwich else None) or hf.hidden_act,
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            norm_offset=1.0 if gemma else 0.0,
            embedding_scale=math.sqrt(hf.hidden_size) if gemma else None,
            sandwich_norms=sandwich,
            attention_scale=hf.query_pre_attn_scalar**-0.5 if sandwich else None,
            attn_softcap=getattr(hf, "attn_logit_softcapping", None),
            final_softcap=getattr(hf, "final_logit_softcapping", None),
            sliding_window=window,
            sliding_layers=sliding,
            local_rope_theta=local_theta,
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


def check_supported(raw: dict, model_type: str) -> None:
    """A ForetellError naming what is missing for a configuration foretell cannot run."""
    supported = f"foretell runs {', '.join(SUPPORTED_MODEL_TYPES)}"
    if "moe" in model_type or model_type == "mixtral" or any(raw.get(k) for k in MOE_KEYS):
        raise ForetellError(f"model type {model_type!r} is a mixture-of-experts model, which is not supported; {supported}")
    if "text_config" in raw or "vision_config" in raw:
        hint = " (its text-only gemma3_text checkpoints are)" if model_type == "gemma3" else ""
        raise ForetellError(f"model type {model_type!r} is a multimodal wrapper, which is not supported{hint}; {supported}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ForetellError(f"model type {model_type!r} is not supported; {supported}")
    if raw.get("use_bidirectional_attention"):
        raise ForetellError(f"{model_type} with use_bidirectional_attention is not a causal decoder; foretell runs causal ones")


def _transformers_config(raw: dict, model_type: str):
    """transformers' configuration object for `raw`: its defaults, legacy keys and derived fields."""
    # start-up: transformers takes about a second to import, and only loading and conversion use it
    from transformers import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(raw))
    except Exception as e:  # transformers validates configurations with many exception types
        raise ForetellError(f"invalid {model_type} configuration: {e}") from None


def _rope_parameters(hf, model_type: str) -> tuple[dict, float | None]:
    """The full-attention layers' rope parameters, and the sliding layers' own base where they have one."""
    params = dict(hf.rope_parameters or {})
    if FULL not in params:
        params.setdefault("rope_theta", getattr(hf, "rope_theta", None) or 10000.0)
        return params, None
    local = params.get(SLIDING) or {}
    if RopeScaling.from_hf(local) is not None:
        raise ForetellError(f"{model_type}: rope scaling on sliding-window layers is not supported (only on full layers)")
    return dict(params[FULL]), (float(local["rope_theta"]) if local else None)


def _sliding(hf, model_type: str) -> tuple[int | None, tuple[int, ...]]:
    """The window and the layers it applies to. Mistral and Phi-3 apply a set window to every layer; the others
    list each layer's kind in layer_types (transformers derives it from use_sliding_window, max_window_layers or
    sliding_window_pattern when a config.json lacks it)."""
    window = getattr(hf, "sliding_window", None)
    kinds = getattr(hf, "layer_types", None) or [SLIDING if window else FULL] * hf.num_hidden_layers
    unknown = sorted(set(kinds) - {SLIDING, FULL})
    if unknown:
        raise ForetellError(f"{model_type}: attention layer types {unknown} are not supported (only {FULL}, {SLIDING})")
    sliding = tuple(i for i, kind in enumerate(kinds) if kind == SLIDING)
    return (int(window), sliding) if window and sliding else (None, ())
