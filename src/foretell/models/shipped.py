"""Trained drafters that ship inside the package, loadable by name (`model="smollm2-135m-head"`).

Each lives in src/foretell/shipped/NAME/: the saved drafter folder (a parallel head, EAGLE-3 head or hidden-state
draft; or a corpus of the target's answers, corpus.py, for `corpus="smollm2-135m-answers"`) and
manifest.json: what it is and for which target, the sha256 of every file, the speculative configuration it was
benchmarked with, and how it was made (command, data, commit, held-out figures). Loading checks all of it, so a
damaged file or a drafter meant for another model fails with a clear error instead of drafting nonsense.
`ship_drafter` writes such a folder from a training run's output.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from foretell.config import SpeculativeConfig
from foretell.corpus import CORPUS_FILE, Corpus
from foretell.errors import ForetellError
from foretell.models.module_folder import INT8_ROW_SCALE, int8_rows_packed

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "shipped"
MANIFEST = "manifest.json"
KINDS = {"parallel-head": "parallel_head.json", "hidden-state": "hidden_draft.json", "eagle3": "eagle3.json",
         "draft-model": "config.json"}  # method -> config file
# a whole draft model (e.g. a distilled small model of the target's family) also ships its tokenizer, so that the
# tokenizer check against the target runs on the shipped files
DRAFT_MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "foretell-model.json")


@dataclass(frozen=True)
class TargetIdentity:
    """What a drafter's target must be: its preset name (for defaults), shapes, and a fingerprint of its token
    embeddings (rounded to bf16, so the same weights match whatever dtype they were loaded in)."""

    name: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    embedding_sha256: str

    @classmethod
    def of(cls, name: str, model) -> TargetIdentity:
        c = model.config
        return cls(name, c.vocab_size, c.hidden_size, c.num_hidden_layers, embedding_fingerprint(model))


def embedding_fingerprint(model) -> str:
    weight = model.embed_tokens.weight.detach().to("cpu", torch.bfloat16).contiguous()
    return hashlib.sha256(weight.view(torch.int16).numpy().tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Manifest:
    name: str
    kind: str  # a speculative method (parallel-head | hidden-state | eagle3), or corpus (corpus.py)
    target: TargetIdentity
    files: dict[str, str]  # file name -> sha256
    speculative: dict  # the configuration it was benchmarked with (SpeculativeConfig dict, model omitted)
    made_by: dict = field(default_factory=dict)  # command, data, commit, held-out figures, bench figures
    default: bool = False  # the target's default drafter (the fastest shipped one, per the bench)
    storage: str = "bf16"  # "int8": matrices as int8 rows with a scale each (module_folder.int8_rows_packed)
    default_on: list[str] = field(default_factory=list)  # CPU classes (kernels.cpu_class) where it is the default

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            raw = json.loads(path.read_text())
            return cls(**{**raw, "target": TargetIdentity(**raw["target"])})
        except FileNotFoundError:
            raise ForetellError(f"{folder} has no {MANIFEST}: not a shipped drafter") from None
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise ForetellError(f"{path} is damaged ({e}); restore it with `git checkout -- {folder}`") from None

    def speculative_config(self):
        """The configuration it ships with, on its own weights (a corpus: drafting from it) by name."""
        mine = {"corpus" if self.kind == "corpus" else "model": self.name}
        return SpeculativeConfig.from_dict({**self.speculative, **mine}, f"{self.name}'s manifest")


def shipped_names(root: Path = SHIPPED_DIR) -> list[str]:
    return sorted(p.name for p in root.iterdir() if (p / MANIFEST).is_file()) if root.is_dir() else []


def shipped_manifests(root: Path = SHIPPED_DIR) -> list[Manifest]:
    return [Manifest.read(root / name) for name in shipped_names(root)]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def verified_folder(name: str, method: str, target_model, root: Path = SHIPPED_DIR) -> Path:
    """The folder of shipped drafter `name` after checking its kind, its files' checksums and its target."""
    folder = root / name
    manifest = Manifest.read(folder)
    if manifest.kind != method:
        if manifest.kind == "corpus":
            raise ForetellError(f"{name!r} is a shipped corpus, not a {method} drafter: give it as --corpus {name}")
        raise ForetellError(f"the shipped drafter {name!r} is a {manifest.kind} drafter, not {method}: use "
                            f"method {manifest.kind!r} with it")
    for file, want in manifest.files.items():
        path = folder / file
        if not path.is_file():
            raise ForetellError(f"the shipped drafter {name!r} is missing {file}; restore it with `git checkout -- {folder}`")
        if sha256_of(path) != want:
            raise ForetellError(f"the shipped drafter {name!r} is damaged: {file} does not match its checksum in "
                                f"{MANIFEST}; restore it with `git checkout -- {folder}` (or reinstall foretell)")
    have = TargetIdentity.of(manifest.target.name, target_model)
    if have != manifest.target:
        differs = [k for k, v in asdict(manifest.target).items() if k != "name" and asdict(have)[k] != v]
        raise ForetellError(f"the shipped drafter {name!r} was trained for {manifest.target.name}; this target differs "
                            f"({', '.join(differs)}): train one for it (docs/training.md) or use prompt lookup")
    return folder


def resolve_drafter_folder(model: str, method: str, target_model, root: Path = SHIPPED_DIR) -> Path:
    """A drafter's weights given as a folder, or as the name of a shipped drafter (checked)."""
    if Path(model).is_dir():
        return Path(model)
    if (root / model / MANIFEST).is_file():
        return verified_folder(model, method, target_model, root)
    names = shipped_names(root)
    raise ForetellError(f"no drafter folder {model!r}, and no shipped drafter of that name"
                        + (f" (shipped: {', '.join(names)})" if names else "") + "; train one (docs/training.md)")


def resolve_corpus(name: str, target_model, root: Path = SHIPPED_DIR):
    """A corpus (corpus.py) given as a file, a folder holding corpus.npz, or the name of a shipped corpus
    (src/foretell/shipped/NAME, kind corpus: its checksum and target checked)."""
    path = Path(name)
    if path.is_dir():
        path = path / CORPUS_FILE
    elif not path.is_file():
        if not (root / name / MANIFEST).is_file():
            names = [m.name for m in shipped_manifests(root) if m.kind == "corpus"]
            raise ForetellError(f"no corpus file {name!r}, and no shipped corpus of that name"
                                + (f" (shipped: {', '.join(names)})" if names else "")
                                + "; build one with `foretell corpus`")
        path = verified_folder(name, "corpus", target_model, root) / CORPUS_FILE
    corpus = Corpus.load(path)
    corpus.check_vocab(target_model.config.vocab_size, str(name))
    return corpus


def ship_corpus(source: Path, name: str, target_name: str, target_model, made_by: dict,
                root: Path = SHIPPED_DIR) -> Path:
    """Copy a corpus file (`foretell corpus`) into the package as NAME, with its manifest (kind corpus): it ships
    as prompt lookup drafting from it (a configuration the bench ranks beside the drafters)."""
    Corpus.load(source).check_vocab(target_model.config.vocab_size, str(source))
    staging = fresh_staging(root, name)
    shutil.copy(source, staging / CORPUS_FILE)
    manifest = Manifest(name, "corpus", TargetIdentity.of(target_name, target_model),
                        {CORPUS_FILE: sha256_of(staging / CORPUS_FILE)}, {"method": "prompt-lookup"}, made_by)
    return install_staged(manifest, staging, root)


def fresh_staging(root: Path, name: str) -> Path:
    """An empty folder beside the package's NAME where a shipped folder is put together before it replaces NAME."""
    staging = root / (name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def install_staged(manifest: Manifest, staging: Path, root: Path) -> Path:
    """Write the manifest into `staging`, then put the folder in the place of the shipped folder of its name."""
    write_manifest(manifest, staging)
    out = root / manifest.name
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def default_shipped(target_name: str, root: Path = SHIPPED_DIR, cpu: str | None = None) -> Manifest | None:
    """The shipped drafter that is this target's (a preset name) default on CPUs of class `cpu`
    (kernels.cpu_class; None: not a CPU run), else the one marked default for it everywhere else, if any."""
    mine = [m for m in shipped_manifests(root) if m.target.name == target_name]
    return next((m for m in mine if cpu in m.default_on), None) or next((m for m in mine if m.default), None)


def make_default(name: str, bench: dict | None = None, root: Path = SHIPPED_DIR, cpu: str | None = None) -> Manifest:
    """Make the shipped drafter `name` its target's default, and no other drafter of that target: on CPUs of class
    `cpu` (its manifest's default_on), or, with cpu None, wherever no class has its own (its default mark). `bench`
    (the run that found it the fastest) goes into its manifest's made_by ("bench_on" by class). Only manifests
    change: the weights' checksums stay valid."""
    chosen = Manifest.read(root / name)
    for manifest in shipped_manifests(root):
        if manifest.target.name != chosen.target.name:
            continue
        mine = manifest.name == name
        if cpu is None:
            made_by = {**manifest.made_by, "bench": bench} if mine and bench else manifest.made_by
            updated = replace(manifest, default=mine, made_by=made_by)
        else:
            on = sorted({c for c in manifest.default_on if c != cpu} | ({cpu} if mine else set()))
            by_class = {**manifest.made_by.get("bench_on", {}), cpu: bench}
            made_by = {**manifest.made_by, "bench_on": by_class} if mine and bench else manifest.made_by
            updated = replace(manifest, default_on=on, made_by=made_by)
        if updated != manifest:
            write_manifest(updated, root / manifest.name)
    return Manifest.read(root / name)


def write_manifest(manifest: Manifest, folder: Path) -> None:
    """Write the manifest whole or not at all (a temporary file, then a rename)."""
    staging = folder / (MANIFEST + ".partial")
    staging.write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    staging.replace(folder / MANIFEST)


def ship_drafter(source: Path, name: str, kind: str, target_name: str, target_model, speculative: dict,
                 made_by: dict, default: bool = False, root: Path = SHIPPED_DIR, storage: str = "bf16") -> Path:
    """Copy a saved drafter folder into the package as `name`, with its manifest. storage "bf16": weights in bf16;
    "int8": its matrices as int8 rows with a scale each, about half the bytes (a drafter only proposes, so the
    rounding can cost acceptance, never exactness; measure the shipped folder)."""
    if storage not in ("bf16", "int8"):
        raise ForetellError(f"shipped weights are stored as bf16 or int8, not {storage!r}")

    if kind not in KINDS:
        raise ForetellError(f"only {', '.join(KINDS)} drafters ship, not {kind}")
    if kind == "draft-model" and storage != "bf16":
        raise ForetellError("a draft model ships in bf16 (its folder is loaded as a model; int8 rows are for heads)")
    config_file = KINDS[kind]
    if not (source / config_file).is_file():
        raise ForetellError(f"{source} is not a saved {kind} drafter (no {config_file})")
    staging = fresh_staging(root, name)
    copied = [config_file] + [f for f in DRAFT_MODEL_FILES if kind == "draft-model" and (source / f).is_file()]
    for file in copied:
        shutil.copy(source / file, staging / file)
    weights = load_file(str(source / "model.safetensors"))
    if storage == "int8":
        weights = int8_rows_packed(weights)
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() and not k.endswith(INT8_ROW_SCALE) else v
               for k, v in weights.items()}, str(staging / "model.safetensors"))
    files = {f: sha256_of(staging / f) for f in (*copied, "model.safetensors")}
    manifest = Manifest(name, kind, TargetIdentity.of(target_name, target_model), files, speculative, made_by, default,
                        storage)
    out = install_staged(manifest, staging, root)
    if default:  # one default a target
        make_default(name, root=root)
    return out
