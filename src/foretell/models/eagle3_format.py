"""EAGLE-3 heads in the checkpoint layout vLLM and SGLang load: export and import, and load_eagle3_head, which
reads either that layout or foretell's own folder.

The layout (docs/eagle3.md cites the loaders' source): a folder with config.json and model.safetensors.

config.json: a Llama configuration of the one draft layer (`architectures: ["LlamaForCausalLMEagle3"]`,
`model_type: "llama"`, `num_hidden_layers: 1`, hidden / head sizes, `intermediate_size`, `rms_norm_eps`,
`rope_theta`, `rope_scaling`, `max_position_embeddings`, `tie_word_embeddings: false`), plus `vocab_size` (the
target's), `draft_vocab_size`, `target_hidden_size` and the auxiliary layers, which the two engines index
differently:
- vLLM reads the top-level `eagle_aux_hidden_state_layer_ids`; id k captures the residual stream entering
  target layer k (0-based), which is foretell's hook layer k;
- SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids`; id k captures the output of target layer k
  (0-based), i.e. it captures before layer k + 1: foretell's hook layer k + 1.
Both are written, each in its engine's convention, so one folder serves both. Without ids both engines
default to foretell's layers (2, L // 2, L - 3).

model.safetensors: `fc.weight` [H, 3H]; `midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}
.weight` [H]; `midlayer.self_attn.{q,k,v}_proj.weight` [heads * D, 2H]; `midlayer.self_attn.o_proj.weight`;
`midlayer.mlp.{gate,up,down}_proj.weight`; `norm.weight`; `lm_head.weight` [draft_vocab_size, H];
`d2t` int64 [draft_vocab_size] (target id = column + d2t[column]); `t2d` bool [vocab_size]. The token
embedding is not written: both engines share the target's.
"""

from __future__ import annotations

import json
from pathlib import Path
import shutil

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save_file

from foretell.errors import ForetellError
from foretell.files import readable_as_umask_allows
from foretell.models.eagle3 import (
    CONFIG_FILE, FOLDER_FORMAT, Eagle3Config, Eagle3Head, default_aux_layers, read_eagle3_config,
)
from foretell.models.module_folder import WEIGHTS_FILE, check_finite, int8_rows_expanded, load_weights, saved_folder
from foretell.models.transformer import Transformer

ARCHITECTURE = "LlamaForCausalLMEagle3"  # SGLang's class name; vLLM's registry maps it to Eagle3LlamaForCausalLM
ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")
WEIGHTS = "model.safetensors"
LAYER = "midlayer."


def engine_state_dict(head: Eagle3Head, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The head's weights under the engines' names: fused projections split, floats in `dtype`."""
    layer, c = head.midlayer, head.config
    q, k, v = layer.qkv_proj.weight.split(layer.split, dim=0)
    gate, up = layer.gate_up_proj.weight.chunk(2, dim=0)
    weights = {
        "fc.weight": head.fc.weight,
        LAYER + "input_layernorm.weight": layer.input_layernorm.weight,
        LAYER + "hidden_norm.weight": layer.hidden_norm.weight,
        LAYER + "self_attn.q_proj.weight": q, LAYER + "self_attn.k_proj.weight": k,
        LAYER + "self_attn.v_proj.weight": v, LAYER + "self_attn.o_proj.weight": layer.o_proj.weight,
        LAYER + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
        LAYER + "mlp.gate_proj.weight": gate, LAYER + "mlp.up_proj.weight": up,
        LAYER + "mlp.down_proj.weight": layer.down_proj.weight,
        "norm.weight": head.norm.weight,
        "lm_head.weight": head.lm_head.weight,
    }
    out = {name: w.detach().to("cpu", dtype).contiguous() for name, w in weights.items()}
    out["d2t"] = head.d2t.detach().to("cpu", torch.int64).contiguous()
    out["t2d"] = head.t2d.detach().to("cpu", torch.bool).contiguous()
    assert out["t2d"].shape == (c.vocab_size,)
    return out


def engine_config(c: Eagle3Config, dtype: torch.dtype = torch.bfloat16) -> dict:
    """config.json for vLLM and SGLang (see the module docstring for the two layer-id conventions)."""
    L = c.target_num_layers
    if len(c.aux_layers) != 3:
        raise ForetellError(f"vLLM and SGLang fuse exactly 3 target layers (fc is 3H -> H); this head fuses "
                            f"{len(c.aux_layers)} ({list(c.aux_layers)}): train one with 3 --aux-layers")
    if min(c.aux_layers) < 1 or max(c.aux_layers) > L - 1:
        raise ForetellError(f"the engines capture the residual stream between decoder layers, foretell's hook layers "
                            f"1..{L - 1}; this head reads {list(c.aux_layers)} (0 = embeddings, {L} = final norm)")
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.hidden_size,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layers),  # vLLM: the input of layer k
        "eagle_config": {"use_aux_hidden_state": True,
                         "eagle_aux_hidden_state_layer_ids": [x - 1 for x in c.aux_layers]},  # SGLang: output of k
        "foretell": {"format": "foretell-eagle3-export", "version": 1, "aux_layers": list(c.aux_layers),
                     "target_num_layers": L},
    }
    return config


def export_eagle3(head: Eagle3Head, out: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the head as config.json + model.safetensors in the engines' layout (atomically)."""
    out = Path(out)
    config = engine_config(head.config, dtype)  # refuses what the engines cannot load before writing anything
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(engine_state_dict(head, dtype), str(tmp / WEIGHTS), metadata={"format": "pt"})
    readable_as_umask_allows(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def aux_layers_of(raw: dict, target_num_layers: int) -> tuple[int, ...]:
    """The head's layers in foretell's indexing from either engine's keys (vLLM's top-level ids first, as vLLM
    reads them; SGLang's eagle_config ids are outputs of layer k, so + 1), else the engines' default."""
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top and nested and [x + 1 for x in nested] != list(top):
        raise ForetellError(f"config.json gives vLLM's aux layers {list(top)} and SGLang's {list(nested)}, which name "
                            "different target layers (SGLang's id k is vLLM's k + 1); fix one of them")
    if top:
        return tuple(int(x) for x in top)
    if nested:
        return tuple(int(x) + 1 for x in nested)
    return default_aux_layers(target_num_layers)


def _check_supported(raw: dict, folder: Path) -> None:
    problems = []
    if not set(raw.get("architectures") or []) & set(ARCHITECTURES):
        problems.append(f"architectures {raw.get('architectures')} (expected one of {', '.join(ARCHITECTURES)})")
    if raw.get("num_hidden_layers", 1) != 1:
        problems.append(f"{raw['num_hidden_layers']} draft layers (foretell runs EAGLE-3's single midlayer)")
    if raw.get("tie_word_embeddings"):
        problems.append("tie_word_embeddings true (SGLang would use the embedding as the output layer)")
    if raw.get("hidden_act", "silu") not in ("silu", "swish"):
        problems.append(f"hidden_act {raw['hidden_act']!r}")
    for flag in ("attention_bias", "mlp_bias", "norm_before_residual", "fc_norm"):
        if raw.get(flag):
            problems.append(f"{flag} true")
    if raw.get("norm_output") is False:
        problems.append("norm_output false")
    if raw.get("target_hidden_size", raw.get("hidden_size")) != raw.get("hidden_size"):
        problems.append("target_hidden_size differs from hidden_size (the head could not share the target's embedding)")
    if problems:
        raise ForetellError(f"{folder / 'config.json'} is an EAGLE-3 head foretell cannot run: {'; '.join(problems)}")


def config_from_engine(raw: dict, target: Transformer, folder: Path) -> Eagle3Config:
    _check_supported(raw, folder)
    t = target.config
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = raw.get("rope_theta") or rope.get("rope_theta") or 10000.0
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")} or None
    if scaling is not None and scaling.get("rope_type", rope.get("type", "default")) == "default":
        scaling = None
    elif scaling is not None:
        scaling.setdefault("rope_type", rope.get("type"))
    H, heads = raw["hidden_size"], raw["num_attention_heads"]
    vocab = raw.get("vocab_size", t.vocab_size)
    return Eagle3Config(
        hidden_size=H, num_attention_heads=heads, num_key_value_heads=raw.get("num_key_value_heads", heads),
        head_dim=raw.get("head_dim") or H // heads, intermediate_size=raw["intermediate_size"], vocab_size=vocab,
        draft_vocab_size=raw.get("draft_vocab_size") or vocab, target_num_layers=t.num_hidden_layers,
        aux_layers=tuple(sorted(aux_layers_of(raw, t.num_hidden_layers))), rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta), max_position_embeddings=raw.get("max_position_embeddings", t.max_position_embeddings),
        rope_scaling=scaling,
    )


def import_eagle3(folder: str | Path, target: Transformer) -> Eagle3Head:
    """An EAGLE-3 checkpoint in the engines' layout (exported by foretell or trained elsewhere) as a head on
    `target` (its dtype and device). Without d2t the draft vocabulary is the whole vocabulary (as vLLM reads
    it); an embed_tokens tensor must be the target's own (the head shares the target's embedding)."""
    folder = Path(folder)
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ForetellError(f"{folder / 'config.json'} is not readable JSON ({e})") from None
    config = config_from_engine(raw, target, folder)
    config.check_target(target.config)
    try:
        state = int8_rows_expanded(load_file(str(folder / WEIGHTS)))  # a shipped head may store int8 rows
    except (SafetensorError, OSError, ValueError) as e:
        raise ForetellError(f"{folder / WEIGHTS} is not a readable safetensors file ({e})") from None
    check_finite(state, folder / WEIGHTS, "EAGLE-3 head")
    head = Eagle3Head(config, target)
    own = fused_state(state, config, target, folder)
    wrong = [k for k, v in own.items() if v.shape != head.state_dict()[k].shape]
    if wrong:
        raise ForetellError(f"{folder / WEIGHTS} does not match its config.json: wrong shape {wrong[:5]}")
    head.load_state_dict({k: v.to(head.state_dict()[k].dtype) for k, v in own.items()})
    head.check_vocab_maps(folder / WEIGHTS)
    return head.to(dtype=target.dtype, device=target.device)


def load_eagle3_head(folder: str | Path, target: Transformer) -> Eagle3Head:
    """A head saved by save_eagle3_head, or an EAGLE-3 checkpoint in the layout vLLM and SGLang load
    (config.json + model.safetensors; import_eagle3), onto `target` (its dtype and device). `folder` may
    be the --out folder of the training run that saved it."""
    folder = saved_folder(folder, FOLDER_FORMAT)
    if not (folder / CONFIG_FILE).is_file() and (folder / "config.json").is_file():
        return import_eagle3(folder, target)
    config = read_eagle3_config(folder)
    config.check_target(target.config)
    head = Eagle3Head(config, target)
    load_weights(head, folder, FOLDER_FORMAT)
    head.check_vocab_maps(folder / WEIGHTS_FILE)
    return head.to(dtype=target.dtype, device=target.device)


def fused_state(state: dict[str, torch.Tensor], c: Eagle3Config, target: Transformer, folder: Path) -> dict:
    """The engines' tensors under the head's own names (q/k/v and gate/up fused; d2t / t2d completed)."""
    state = dict(state)

    def take(name: str) -> torch.Tensor:
        for candidate in (name, "model." + name, name.replace(LAYER, "layers.0."), "model." + name.replace(LAYER, "layers.0.")):
            if candidate in state:
                return state.pop(candidate)
        raise ForetellError(f"{folder / WEIGHTS} lacks tensor {name!r}")

    own = {"fc.weight": take("fc.weight"), "norm.weight": take("norm.weight"), "lm_head.weight": take("lm_head.weight")}
    attn, mlp = LAYER + "self_attn.", LAYER + "mlp."
    own["midlayer.qkv_proj.weight"] = torch.cat([take(attn + f"{n}_proj.weight") for n in "qkv"])
    own["midlayer.o_proj.weight"] = take(attn + "o_proj.weight")
    own["midlayer.gate_up_proj.weight"] = torch.cat([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")])
    own["midlayer.down_proj.weight"] = take(mlp + "down_proj.weight")
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        own[f"midlayer.{norm}.weight"] = take(LAYER + f"{norm}.weight")
    d2t = state.pop("d2t", None)
    t2d = state.pop("t2d", None)
    if d2t is None:
        if c.draft_vocab_size != c.vocab_size:
            raise ForetellError(f"{folder / WEIGHTS} has no d2t, but its draft vocabulary ({c.draft_vocab_size}) is "
                                f"smaller than the vocabulary ({c.vocab_size})")
        d2t = torch.zeros(c.draft_vocab_size, dtype=torch.long)
    own["d2t"] = d2t.long()
    if t2d is None:
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        ids = torch.arange(c.draft_vocab_size) + own["d2t"]
        t2d[ids[(ids >= 0) & (ids < c.vocab_size)]] = True  # an id out of range: check_vocab_maps names the file
    own["t2d"] = t2d.bool()
    embedding = next((state.pop(k) for k in ("embed_tokens.weight", "model.embed_tokens.weight") if k in state), None)
    if embedding is not None and not same_embedding(embedding, target):
        raise ForetellError(f"{folder / WEIGHTS} carries its own token embedding, unlike the target's; foretell's head "
                            "shares the target's embedding, so it cannot run this head as trained")
    leftovers = [k for k in state if "rotary_emb" not in k]
    if leftovers:
        raise ForetellError(f"{folder / WEIGHTS} has tensors an EAGLE-3 head does not: {leftovers[:5]}")
    return own


def same_embedding(embedding: torch.Tensor, target: Transformer) -> bool:
    """True when a checkpoint's embedding is the target's at bf16 precision (heads are usually saved in bf16)."""
    mine = target.embed_tokens.weight.detach().to("cpu", torch.bfloat16)
    return embedding.shape == mine.shape and torch.equal(embedding.to(torch.bfloat16), mine)
