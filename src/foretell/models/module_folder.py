"""Small trained modules (a parallel head, a hidden-state draft) stored as a folder: a JSON file
with format, version and typed config, plus `model.safetensors` with the module's own weights.
One implementation so every kind gets the same checks and the same one-line errors."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save_file

from foretell.errors import ForetellError
from foretell.files import readable_as_umask_allows

WEIGHTS_FILE = "model.safetensors"
# A matrix stored in int8 (shipped drafters within the package's size budget): codes under its own name, a float
# scale per row under name + this suffix; loading turns it back into floats (models/shipped.py packs it).
INT8_ROW_SCALE = ".int8_row_scale"


def int8_rows_packed(state: dict[str, torch.Tensor], min_numel: int = 1024) -> dict[str, torch.Tensor]:
    """Every float matrix of at least `min_numel` values as int8 codes and a scale per row (w ~ code * scale,
    scale = max |row| / 127); other tensors as they are."""
    out = {}
    for name, t in state.items():
        if t.is_floating_point() and t.dim() == 2 and t.numel() >= min_numel:
            w = t.float()
            scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
            out[name] = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
            out[name + INT8_ROW_SCALE] = scale
        else:
            out[name] = t
    return out


def int8_rows_expanded(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of int8_rows_packed: int8 matrices with their row scales back to float32."""
    out = {k: v for k, v in state.items() if not k.endswith(INT8_ROW_SCALE)}
    for name, scale in state.items():
        if name.endswith(INT8_ROW_SCALE):
            codes = out.get(name.removesuffix(INT8_ROW_SCALE))
            if codes is None or codes.dtype != torch.int8 or codes.dim() != 2 or codes.shape[0] != scale.numel():
                raise ForetellError(f"{name} scales no int8 matrix of {scale.numel()} rows; the file is damaged")
            out[name.removesuffix(INT8_ROW_SCALE)] = codes.float() * scale.float()[:, None]
    return out


@dataclass(frozen=True)
class FolderFormat:
    name: str  # e.g. "foretell-parallel-head"
    version: int
    config_file: str  # e.g. "parallel_head.json"
    what: str  # how errors name it, e.g. "parallel head"
    run_part: str = "head"  # the subfolder of a training run's folder that `foretell train KIND --out RUN` saves it in
    method: str = ""  # the speculative method that drafts with it, e.g. "parallel-head"
    flag: str = ""  # the CLI flag that takes its folder, e.g. "--head"


# The kinds of trained drafter folders, here in one place so an error about one kind can recognise the others.
PARALLEL_HEAD_FORMAT = FolderFormat("foretell-parallel-head", 1, "parallel_head.json", "parallel head", "head",
                                    "parallel-head", "--head")
HIDDEN_DRAFT_FORMAT = FolderFormat("foretell-hidden-draft", 1, "hidden_draft.json", "hidden-state draft", "draft",
                                   "hidden-state", "--hidden-draft")
EAGLE3_FORMAT = FolderFormat("foretell-eagle3", 1, "eagle3.json", "EAGLE-3 head", "head", "eagle3", "--eagle")
FORMATS = (PARALLEL_HEAD_FORMAT, HIDDEN_DRAFT_FORMAT, EAGLE3_FORMAT)


def saved_kind(folder: str | Path) -> tuple[FolderFormat, Path] | None:
    """The kind of trained drafter `folder` holds and the folder holding its config file: `folder` itself, or the
    subfolder a training run saves it in (RUN/head, RUN/draft); None when it holds none of them."""
    folder = Path(folder)
    for fmt in FORMATS:
        for where in (folder, folder / fmt.run_part):
            if (where / fmt.config_file).is_file():
                return fmt, where
    return None


def run_folder_of(module_folder: Path, fmt: FolderFormat) -> Path:
    """The training run's --out folder a saved module lives in (RUN for RUN/head), or the folder itself."""
    return module_folder.parent if module_folder.name == fmt.run_part else module_folder


def saved_folder(folder: str | Path, fmt: FolderFormat) -> Path:
    """`folder` when it holds a saved module, else the module inside it when it is a training run's folder (RUN/head
    or RUN/draft), so the folder given to `foretell train --out` names the trained drafter too."""
    folder = Path(folder)
    inner = folder / fmt.run_part
    if not (folder / fmt.config_file).is_file() and (inner / fmt.config_file).is_file():
        return inner
    return folder


def not_saved_here(folder: Path, fmt: FolderFormat) -> str:
    """Why `folder` (a folder without the config file) holds no saved module, and where one would be."""
    inner = folder / fmt.run_part
    other = saved_kind(folder)
    if other is not None and other[0] != fmt:
        kind, where = other
        return (f"{folder} holds a {kind.what} ({where / kind.config_file}), not a {fmt.what}: pass it with "
                f"{kind.flag} (--drafter {kind.method}); {fmt.flag} takes a {fmt.what}'s folder")
    if (folder / "train" / "job.json").is_file():
        return (f"{folder} is a training run whose {fmt.what} is not saved yet ({inner} has no {fmt.config_file}): "
                "rerun its `foretell train` command to finish training")
    return (f"{folder} has no {fmt.config_file}, nor has {inner}: it is not a saved {fmt.what}, nor the --out folder of "
            f"a training run that saved one (a run saves it in OUT/{fmt.run_part})")


def check_finite(state: dict[str, torch.Tensor], path: Path, what: str) -> None:
    """NaN or infinity in a drafter's weights loads without complaint and then spoils every draft (no draft is
    accepted): refuse the file, naming it and the tensors."""
    bad = [name for name, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ForetellError(f"{path} holds NaN or infinite values (in {', '.join(bad[:3])}{more}): the {what}'s "
                            "weights are damaged; train or save it again")


def save_module(module: torch.nn.Module, config: Any, folder: str | Path, fmt: FolderFormat) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": fmt.name, "version": fmt.version, "config": asdict(config)}
    (folder / fmt.config_file).write_text(json.dumps(meta, indent=2) + "\n")
    save_file({k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}, str(folder / WEIGHTS_FILE))
    return readable_as_umask_allows(folder)


def read_config(folder: Path, config_cls: type, fmt: FolderFormat):
    path = folder / fmt.config_file
    if not folder.is_dir():
        raise ForetellError(f"no {fmt.what} folder at {folder}: expected a folder with {fmt.config_file} and {WEIGHTS_FILE}")
    if not path.is_file():
        raise ForetellError(not_saved_here(folder, fmt))
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ForetellError(f"{path} is not valid JSON ({e}); save the {fmt.what} again") from None
    if not isinstance(meta, dict) or meta.get("format") != fmt.name or meta.get("version") != fmt.version:
        raise ForetellError(f"{path} is not a {fmt.name} v{fmt.version} file; save the {fmt.what} again with this foretell")
    raw = meta.get("config")
    names = {f.name for f in fields(config_cls)}
    if not isinstance(raw, dict) or set(raw) - names:
        raise ForetellError(f"{path} has an unreadable config; save the {fmt.what} again")
    try:
        return config_cls(**raw)
    except TypeError as e:
        raise ForetellError(f"{path} has an incomplete config ({e}); save the {fmt.what} again") from None


def load_weights(module: torch.nn.Module, folder: Path, fmt: FolderFormat) -> None:
    """Fill `module` from the folder's weights, refusing missing, extra or misshapen tensors."""
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise ForetellError(f"{folder} has no {WEIGHTS_FILE}: the {fmt.what}'s weights are missing")
    try:
        state = int8_rows_expanded(load_file(str(weights)))
    except (SafetensorError, OSError, ValueError) as e:
        raise ForetellError(f"{weights} is not a readable safetensors file ({e}); save the {fmt.what} again") from None
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    wrong = [k for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        raise ForetellError(
            f"{weights} does not match {fmt.config_file}: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"wrong shape {wrong[:5]}; save the {fmt.what} again"
        )
    check_finite(state, weights, fmt.what)
    module.load_state_dict(state)
