"""What a GGUF file's metadata says about its architecture, beyond what transformers' GGUF reader keeps.

foretell converts GGUF files with transformers' reader (it dequantizes and renames the tensors), then corrects the
configuration it writes where that reader drops llama.cpp metadata the runtime needs:

- RoPE: `{arch}.rope.scaling.*` (linear, yarn), Llama 3.1's `rope_freqs` tensor (llama.cpp stores the scaled
  frequencies as per-dimension divisors), Phi-3's `rope_factors_long` / `rope_factors_short` tensors, a partial
  rotary width `{arch}.rope.dimension_count` (Phi-4-mini) and Gemma 3's local base `{arch}.rope.freq_base_swa`.
- Sliding windows: `{arch}.attention.sliding_window` (Phi-3) and Gemma 3's `sliding_window_pattern`. llama.cpp
  writes Mistral models with the llama architecture and no window, and attends fully; so does foretell (never
  transformers' MistralConfig default of 4096).
- Gemma 2's `attn_logit_softcapping` and `final_logit_softcapping`.

Not in GGUF metadata, so taken from transformers' defaults: Gemma 2's query_pre_attn_scalar (256; llama.cpp
hard-codes 144 for the 27B model, so a Gemma 2 27B GGUF is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foretell.errors import ForetellError
from foretell.models.config import FULL, SLIDING

# general.architecture values transformers' GGUF reader converts and foretell runs (Mistral files say "llama").
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")


def open_gguf(path: Path):
    """A gguf.GGUFReader over `path`, its architecture checked against GGUF_ARCHITECTURES."""
    # start-up: gguf (~60 ms to import) is read only for GGUF files
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the reader raises several types for a damaged file
        raise ForetellError(f"could not read GGUF file {path}: {e}. Is it complete?") from None
    arch = field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        kind = "a mixture-of-experts model, which is not supported" if "moe" in str(arch) else "not supported"
        raise ForetellError(
            f"GGUF architecture {arch!r} in {path.name} is {kind}; foretell loads GGUF files of "
            f"{', '.join(GGUF_ARCHITECTURES)} (Llama 2 / 3.x, Mistral, Qwen2 / 2.5, Qwen3, Phi-3 / Phi-4, Gemma 2 / 3)"
        )
    if arch == "gemma2" and field(reader, "gemma2.block_count") == 46:
        raise ForetellError("Gemma 2 27B GGUF files are not supported: their attention scale is not in the metadata")
    return reader


def field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def tensor(reader, name: str) -> list[float] | None:
    for t in reader.tensors:
        if t.name == name:
            return np.asarray(t.data, dtype=np.float64).reshape(-1).tolist()
    return None


def correct_config(reader, raw: dict) -> dict:
    """`raw` (transformers' config.to_dict() of the converted model) with the metadata its reader dropped."""
    arch = field(reader, "general.architecture")

    def key(name: str) -> str:
        return f"{arch}.{name}"

    raw = dict(raw)
    window = field(reader, key("attention.sliding_window"))
    if window:
        raw["sliding_window"] = int(window)
    elif arch == "llama":
        raw["sliding_window"] = None
    pattern = field(reader, key("attention.sliding_window_pattern"))
    if pattern is not None and arch == "gemma3":
        n = raw["num_hidden_layers"]
        sliding = [bool(pattern[i]) for i in range(n)] if isinstance(pattern, list) else [bool((i + 1) % int(pattern)) for i in range(n)]
        raw["layer_types"] = [SLIDING if s else FULL for s in sliding]
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if field(reader, key(name)) is not None:
            raw[name] = float(field(reader, key(name)))
    scaling = rope_scaling(reader, arch, raw)
    rotated = field(reader, key("rope.dimension_count"))  # Phi-4-mini rotates 3/4 of each head
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    if rotated and arch != "llama" and int(rotated) < head_dim:  # (for llama the reader takes it as head_dim)
        scaling["partial_rotary_factor"] = int(rotated) / head_dim
    params = raw.get("rope_parameters") or {}
    if FULL in params:  # Gemma 3: one entry per layer kind
        params = {kind: dict(p or {}) for kind, p in params.items()}
        if scaling:
            params[FULL].update(scaling)
        local_base = field(reader, key("rope.freq_base_swa"))
        if local_base is not None:
            params[SLIDING]["rope_theta"] = float(local_base)
    elif scaling:
        params = {**params, **scaling}
    raw["rope_parameters"] = params
    raw.pop("rope_scaling", None)
    return raw


def rope_scaling(reader, arch: str, raw: dict) -> dict:
    """rope_parameters entries (transformers' names) for the scaling the file describes; {} for none."""
    def key(name: str) -> str:
        return f"{arch}.rope.scaling.{name}"

    original = field(reader, key("original_context_length"))
    long, short = tensor(reader, "rope_factors_long.weight"), tensor(reader, "rope_factors_short.weight")
    if long is not None and short is not None:  # Phi-3: LongRoPE's two factor sets
        out = {"rope_type": "longrope", "long_factor": long, "short_factor": short}
        if original is not None:
            out["original_max_position_embeddings"] = int(original)
            raw["original_max_position_embeddings"] = int(original)
        if field(reader, key("attn_factor")) is not None:
            out["attention_factor"] = float(field(reader, key("attn_factor")))
        return out
    freqs = tensor(reader, "rope_freqs.weight")
    if freqs is not None:
        # Llama 3.1+: llama.cpp divides each default frequency by its factor. transformers' longrope with the same
        # short and long factors and no attention factor computes exactly that at every position.
        return {"rope_type": "longrope", "long_factor": freqs, "short_factor": freqs, "attention_factor": 1.0,
                "original_max_position_embeddings": int(raw["max_position_embeddings"])}
    kind = field(reader, key("type"))
    if kind in (None, "none"):
        return {}
    if kind not in ("linear", "yarn"):
        raise ForetellError(f"GGUF rope scaling {kind!r} is not supported (linear, yarn and rope_freqs are)")
    out = {"rope_type": kind, "factor": float(field(reader, key("factor")))}
    if original is not None:
        out["original_max_position_embeddings"] = int(original)
    if kind == "yarn":
        for gguf_name, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if field(reader, key(gguf_name)) is not None:
                out[name] = float(field(reader, key(gguf_name)))
        # llama.cpp multiplies YaRN's own attention factor by attn_factor; transformers has no such knob.
        if field(reader, key("attn_factor"), 1.0) != 1.0:
            raise ForetellError("GGUF YaRN scaling with an extra attn_factor is not supported")
    return out


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file as read_tensor_table finds it: its ggml type, its dims as the file lists them
    (ne0 first: a projection's inputs, then its rows) and its bytes (a read-only view of the file)."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 [nbytes]


# GGUF metadata value types with a fixed size (bytes); 8 is a string, 9 an array
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read_tensor_table(path: Path) -> tuple[str, dict[str, GgufTensor]]:
    """The file's architecture and its tensors, read from the header alone. gguf.GGUFReader builds an object for
    every metadata element first, ~16 s for a Qwen2.5 file's 150K-token vocabulary; this steps over the metadata
    and maps the tensors' bytes."""
    # start-up: gguf (~60 ms to import) is read only for GGUF files
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ForetellError(f"could not read GGUF file {path}: {e}") from None
    buf = memoryview(raw)
    at = 0

    def u(size: int) -> int:
        nonlocal at
        if at + size > len(buf):
            raise ForetellError(f"GGUF file {path} ends inside its header: is it complete?")
        value = int.from_bytes(buf[at:at + size], "little")
        at += size
        return value

    def text() -> str:
        nonlocal at
        size = u(8)
        value = bytes(buf[at:at + size]).decode("utf-8", errors="replace")
        at += size
        return value

    def skip_value(kind: int) -> None:
        nonlocal at
        if kind in _FIXED:
            at += _FIXED[kind]
        elif kind == 8:
            size = u(8)  # read first: `at += u(8)` would add to the position from before the length
            at += size
        elif kind == 9:
            item, count = u(4), u(8)
            if item in _FIXED:
                at += _FIXED[item] * count
            else:
                for _ in range(count):
                    skip_value(item)
        else:
            raise ForetellError(f"GGUF file {path} has a metadata value of unknown type {kind}: is it complete?")

    if u(4) != 0x46554747:  # "GGUF"
        raise ForetellError(f"{path} is not a GGUF file (no GGUF magic at its start)")
    version, n_tensors, n_fields = u(4), u(8), u(8)
    if version < 2:
        raise ForetellError(f"GGUF file {path} is version {version}; foretell reads versions 2 and 3")
    arch, alignment = "", 32
    for _ in range(n_fields):
        key, kind = text(), u(4)
        if key == "general.architecture" and kind == 8:
            arch = text()
        elif key == "general.alignment" and kind == 4:
            alignment = u(4)
        else:
            skip_value(kind)
    infos = []
    for _ in range(n_tensors):
        name, dims = text(), u(4)
        shape = tuple(u(8) for _ in range(dims))
        infos.append((name, shape, u(4), u(8)))
    start = -(-at // alignment) * alignment
    tensors = {}
    for name, shape, kind, offset in infos:
        ggml = GGMLQuantizationType(kind)
        values, size = GGML_QUANT_SIZES[ggml]
        nbytes = int(np.prod(shape, dtype=np.int64)) // values * size
        if start + offset + nbytes > len(raw):
            raise ForetellError(f"GGUF file {path} ends inside tensor {name}: is it complete?")
        tensors[name] = GgufTensor(name, ggml, shape, raw[start + offset:start + offset + nbytes])
    return arch, tensors
