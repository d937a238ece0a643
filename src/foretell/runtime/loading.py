"""Load a model from a Hugging Face folder, a GGUF file or a named preset, fully offline.

GGUF files (and presets, which are GGUF files inside packages) are dequantized once by
transformers and cached as an fp32 safetensors folder; later loads read that folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from foretell.errors import ForetellError
from foretell.models import presets
from foretell.models.config import ModelConfig
from foretell.models.gguf_meta import correct_config, open_gguf
from foretell.models.presets import PRESETS, assemble_chunks, locate_single_gguf
from foretell.models.trained import TRAINED_DRAFTS
from foretell.models.transformer import Transformer
from foretell.paths import default_cache_dir
from foretell.runtime.config import parse_dtype
from foretell.runtime.lean_step import LeanTransformer

DONE_MARKER = "foretell-converted.json"


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: object  # a transformers tokenizer
    config: ModelConfig
    path: Path
    name: str


def kept_gguf(spec: str | Path, cache_dir: Path | None = None) -> Path | None:
    """The GGUF file of a model spec on disk, for runtimes that read its blocks (--quant gguf, llama.cpp). A chunked
    preset's file is deleted once converted, so it is assembled again from its installed chunks (checksummed) and
    kept in the cache for the next run."""
    path = presets.gguf_file(spec)
    spec = str(spec)
    if path is not None or spec not in PRESETS or not presets.preset_available(spec):
        return path
    preset = PRESETS[spec]
    kept = Path(cache_dir or default_cache_dir()) / "gguf" / preset.gguf_filename
    return kept if kept.is_file() else presets.assemble_chunks(preset, kept)


def resolve_model_dir(spec: str | Path, cache_dir: Path | None = None) -> Path:
    """Turn a preset name, a GGUF path or a folder into a Hugging Face folder on disk."""
    cache_dir = Path(cache_dir or default_cache_dir())
    spec_str = str(spec)
    if spec_str in PRESETS:
        preset = PRESETS[spec_str]
        out = cache_dir / "presets" / preset.name
        if (out / DONE_MARKER).is_file():
            return out
        if preset.single_file_module:
            return convert_gguf(locate_single_gguf(preset), out)
        gguf = assemble_chunks(preset, cache_dir / "downloads" / preset.gguf_filename)
        try:
            return convert_gguf(gguf, out)
        finally:
            gguf.unlink(missing_ok=True)  # the safetensors folder replaces it
    if spec_str in TRAINED_DRAFTS:
        trained = TRAINED_DRAFTS[spec_str]
        folder = trained.model_dir(cache_dir)
        if not (folder / "config.json").is_file():
            raise ForetellError(f"the draft {spec_str!r} has not been trained on this machine yet: run `{trained.command}`")
        return folder
    path = Path(spec_str).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        out = cache_dir / "gguf" / f"{path.stem}-{key}"
        return out if (out / DONE_MARKER).is_file() else convert_gguf(path, out)
    if path.is_dir():
        return path
    raise ForetellError(
        f"no model {spec_str!r}: give a preset ({', '.join(PRESETS)}), a trained draft ({', '.join(TRAINED_DRAFTS)}), "
        "a .gguf file or a Hugging Face folder"
    )


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF file into an fp32 safetensors folder (once; written atomically).

    transformers' reader dequantizes and renames; its configuration is then corrected with the metadata that
    reader drops (gguf_meta.py). Architectures foretell does not run are refused before any conversion."""
    # start-up: transformers takes about a second to import, and only loading and conversion use it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reader = open_gguf(gguf)
    print(f"foretell: converting {gguf.name} to safetensors in {out_dir} (once)", file=sys.stderr)
    try:
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as e:  # transformers raises many types for a bad file
        raise ForetellError(f"could not read GGUF file {gguf}: {e}. Is it complete?") from None
    raw = correct_config(reader, hf.config.to_dict())
    raw.pop("quantization_config", None)
    ModelConfig.from_hf_dict(raw)  # a configuration the runtime cannot run fails here, before anything is written
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(raw, indent=2))
    tokenizer.save_pretrained(tmp)
    (tmp / DONE_MARKER).write_text(json.dumps({"source": str(gguf), "bytes": gguf.stat().st_size}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


class LazyState:
    """A checkpoint's tensors by name, each read from its safetensors file when taken (pop), so that tensors the
    model will not use (projections a GGUF file's blocks replace) are never read: `forget` drops one unread."""

    def __init__(self, files: list[Path]):
        self._where: dict[str, Path] = {}
        self._open = {}
        for f in files:
            try:
                handle = safe_open(str(f), framework="pt")
            except Exception as e:  # safetensors raises its own error types, and OSError
                raise corrupt(f, e) from None
            self._open[f] = handle
            self._where.update(dict.fromkeys(handle.keys(), f))

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __iter__(self):
        return iter(list(self._where))

    _MISSING = object()

    def pop(self, name: str, default=_MISSING) -> torch.Tensor:
        f = self._where.pop(name, None)
        if f is None:
            if default is LazyState._MISSING:
                raise KeyError(name)
            return default
        try:
            return self._open[f].get_tensor(name)
        except Exception as e:
            raise corrupt(f, e) from None

    def forget(self, name: str) -> None:
        self._where.pop(name, None)


def corrupt(f: Path, e: Exception) -> ForetellError:
    return ForetellError(f"weights file {f} is corrupt or truncated ({e}); re-create or re-convert it")


def read_state_dict(folder: Path) -> LazyState:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ForetellError(f"no *.safetensors weights in {folder}")
    return LazyState(files)


def load_tokenizer(folder: Path):
    # start-up: transformers takes about a second to import, and only loading and conversion use it
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:
        raise ForetellError(f"could not load the tokenizer in {folder}: {e}") from None


def build_model(folder: Path, dtype: torch.dtype, device: str | torch.device = "cpu",
                skip: frozenset[str] = frozenset()) -> LeanTransformer:
    """The model in `folder` as the fast-path target (runtime/lean_step.LeanTransformer: the PyTorch model until
    runtime.prepare gives it the lean step). skip: weights (the model's own names) left unread and uninitialised,
    for layers about to be replaced (a GGUF file's blocks: gguf_quant.replaced_weights)."""
    config = ModelConfig.from_file(folder / "config.json")
    with torch.device("meta"):
        model = LeanTransformer(config)
    model = model.to_empty(device=device)
    state = read_state_dict(folder)
    try:
        model.load_hf_state_dict(state, skip)
    except KeyError as e:
        raise ForetellError(f"weights in {folder} do not fit its config.json: {e.args[0]}") from None
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.to(dtype=dtype).eval().requires_grad_(False)


def load_model(
    spec: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    cache_dir: Path | None = None,
    skip: frozenset[str] = frozenset(),
) -> LoadedModel:
    """skip: weights left unread (build_model)."""
    folder = resolve_model_dir(spec, cache_dir)
    model = build_model(folder, parse_dtype(dtype), device, skip)
    return LoadedModel(model, load_tokenizer(folder), model.config, folder, str(spec))
