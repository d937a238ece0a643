"""A target's int8 / int4 layers kept on disk between loads, as the GGUF conversion is kept.

Quantizing Qwen2.5-Coder-1.5B to int4 takes ~16 s on 2 cores, after reading its 5.5 GB of float32 projections. The
first load writes the quantized layers to one safetensors file in the cache; later loads leave those projections
unread (`kept_weights`) and rebuild the layers from the file (`load_kept`): int4 as its Q4_1 blocks (the layout the
lean step reads; PyTorch's packed layout is made again here, so the file does not depend on the CPU), int8 as its
codes and row scales. The file is named by what it was made from (the folder's weights, the mode, the dtype,
foretell's format version); a file that fails to read is deleted and the model quantized again.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from torch import nn
from safetensors import safe_open
from safetensors.torch import save_file

from foretell.errors import ForetellError
from foretell.runtime.quant import Int4Linear, Int8Linear, q4_blocks

FORMAT = 1  # bump when what a file holds changes: older files are then not found, and made again
KEPT_MODES = ("int8", "int4")
KEEP_BYTES = 200_000_000  # smaller models (~50M float32 weights) quantize in a moment: not kept


def kept_quant_file(folder: Path, mode: str, dtype: str, cache_dir: Path) -> Path | None:
    """Where `folder`'s model quantized to `mode` in `dtype` is kept; None for modes not kept and small models."""
    if mode not in KEPT_MODES:
        return None
    weights = sorted(folder.glob("*.safetensors"))
    if sum(f.stat().st_size for f in weights) < KEEP_BYTES:
        return None
    stamp = [f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in weights]
    key = hashlib.sha256(json.dumps([stamp, mode, dtype, FORMAT]).encode()).hexdigest()[:12]
    return cache_dir / "quant" / f"{folder.name}-{mode}-{dtype}-{key}.safetensors"


def layer_names(path: Path | None) -> list[str]:
    """The quantized layers a kept file holds (module names); [] where there is no readable file."""
    if path is None or not path.is_file():
        return []
    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads(f.metadata()["layers"])
    except Exception as e:  # a truncated or foreign file: made again
        print(f"foretell: {path} is not a readable quantized model ({e}); quantizing again", file=sys.stderr)
        path.unlink(missing_ok=True)
        return []


def kept_weights(names: list[str]) -> frozenset[str]:
    """The float weights loading may leave unread: the kept layers `names` replace theirs."""
    return frozenset(f"{name}.weight" for name in names)


def save_kept(model: nn.Module, path: Path) -> None:
    """Write every Int4Linear / Int8Linear of `model` to `path` (atomically: a file that exists is whole)."""
    tensors, layers = {}, []
    for name, layer in model.named_modules():
        if isinstance(layer, Int4Linear) and layer.group == 32:
            codes, dm = q4_blocks(layer)
            tensors.update({f"{name}.codes": codes, f"{name}.dm": dm})
        elif isinstance(layer, Int8Linear):
            tensors.update({f"{name}.codes8": layer.weight_int8, f"{name}.scale": layer.scale})
        else:
            continue
        if layer.bias is not None:
            tensors[f"{name}.bias"] = layer.bias
        layers.append(name)
    if not layers:
        return
    print(f"foretell: keeping the quantized layers in {path} for the next load", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(partial),
              metadata={"layers": json.dumps(layers)})
    partial.rename(path)
    # the same model, mode and dtype made from other weights (or in an older format): never read again
    for stale in path.parent.glob(path.name.rsplit("-", 1)[0] + "-*.safetensors"):
        if stale != path:
            stale.unlink(missing_ok=True)


def load_kept(model: nn.Module, path: Path, names: list[str]) -> None:
    """Replace the layers `names` of `model` by the quantized ones kept in `path` (layer_names(path)); their float
    weights may have been left unread (kept_weights)."""
    print(f"foretell: quantized layers from {path} (made once)", file=sys.stderr)
    try:
        with safe_open(str(path), framework="pt", device=str(model.device)) as f:
            _replace_layers(model, f, names)
    except Exception as e:
        raise ForetellError(f"could not read the quantized model {path} ({e}); delete it and load again to "
                            "quantize anew") from None


def _replace_layers(model: nn.Module, f, names: list[str]) -> None:
    keys = set(f.keys())
    for name in names:
        bias = f.get_tensor(f"{name}.bias") if f"{name}.bias" in keys else None
        if f"{name}.codes" in keys:
            layer = Int4Linear.from_blocks(f.get_tensor(f"{name}.codes"), f.get_tensor(f"{name}.dm"), bias)
        else:
            layer = Int8Linear(f.get_tensor(f"{name}.codes8"), f.get_tensor(f"{name}.scale"), bias)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer)

