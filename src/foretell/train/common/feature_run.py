"""What a run of a drafter trained on the target's features starts from (parallel head, hidden state, EAGLE-3).

Its training data (data.py: one source or a mix), held-out data, the frozen
target and the feature cache, each made once and reused while its settings hold; and the shape
check of a warm start. `cfg` below is any such kind's run config: a FeatureRunConfig with the kind's
shape, loss and train (its TrainConfig). With several processes (a DistContext) the main process makes the
files and the others read them (ctx.first), the feature pass is sharded, and only the main process
writes the run folder, the trained module and the evaluation.

A run (FeatureRun) goes in two phases. First it reads: the target, the run folder's stored settings, the held-out
data, the frozen target and any warm start; every check is there, so a refused run writes nothing and its folder
stays as it was. Then it writes: the data, train/job.json, the feature cache, the checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
import shutil

import torch

from foretell.errors import ForetellError
from foretell.models.config import ModelConfig
from foretell.runtime.config import RuntimeConfig
from foretell.runtime.loading import build_model, load_tokenizer, parse_dtype, resolve_model_dir
from foretell.runtime.prepare import prepare
from foretell.train.common.cache import META, fingerprint_of, read_meta
from foretell.train.common.data import DataConfig, DataReport, TokenData, build_token_data
from foretell.train.common.distributed import DistContext
from foretell.train.common.features import (
    FeatureCache, FeatureConfig, build_feature_cache, cache_settings, open_if_complete,
)
from foretell.train.common.run_folder import DONE, JOB, SettingsJob, differences, open_job_folder
from foretell.train.common.trainer import TrainConfig

REPORT = "report.json"  # in OUT/data: rows per source and the evaluation-prompt filter's counts
SETTINGS = "data.json"  # in OUT/data: the DataConfig the sequences were made with
# The option that sets each stored setting (a dotted path into train/job.json) where it is not "--" + its last
# name with dashes; a setting no option sets (derived from the target, say) is named by its path.
FLAGS = {
    "target": "--target", "data.source": "--data", "data.num_sequences": "--num-sequences", "data.seq_len": "--seq-len",
    "data.pack": "--pack", "features.top_k": "--topk-teacher", "features.batch_size": "--feature-batch",
    "features.dtype": "--feature-dtype", "train.steps": "--steps", "train.batch_size": "--batch-size",
    "train.lr": "--lr", "train.warmup_steps": "--warmup", "train.bf16": "--bf16", "train.checkpoint_every": "--checkpoint-every",
    "train.seed": "--seed", "head.depth": "--depth", "head.num_layers": "--head-layers",
    "head.fuse_layers": "--fuse-layers", "head.aux_layers": "--aux-layers", "head.draft_vocab_size": "--draft-vocab",
    "draft.draft_vocab_size": "--draft-vocab", "draft.token_info_rank": "--token-info-rank",
    "init_layer": "--init-layer", "init_head": "--init-head", "init_draft": "--init-draft",
}
OWN_FLAGS = ("loss", "shape")  # every field of these is an option of the kind, named alike


@dataclass(frozen=True)
class FeatureRunConfig:
    """The settings every kind trained on cached features has; a kind's config adds its shape, loss, train
    (its TrainConfig, with the kind's defaults) and warm start."""

    target: str
    out: Path
    data: DataConfig = field(default_factory=DataConfig)  # source may also be "both"
    eval_data: str | None = None  # None: the test split of data.source (a .jsonl file has no split: give one)
    eval_sequences: int = 64  # 0 = no evaluation
    features: FeatureConfig = field(default_factory=FeatureConfig)
    resume: bool = True
    stop_after: int | None = None  # stop training early (tests of resuming)
    features_from: Path | None = None  # another run's folder whose data and feature cache this run reads (never writes)


def feature_schedule(lr: float = 1e-3) -> TrainConfig:
    """The schedule of the kinds trained on cached features, so that their comparisons get the same budget; lr
    1e-3 suits a fresh head, larger than AdaSPEC's 3e-4 for a pretrained draft."""
    return TrainConfig(steps=1000, batch_size=16, micro_batch_size=1, lr=lr, checkpoint_every=100)


def flag_of(path: str) -> str:
    """The option that sets a stored setting (a dotted path into train/job.json), or the path itself."""
    if path in FLAGS:
        return FLAGS[path]
    group, _, name = path.partition(".")
    return "--" + name.replace("_", "-") if group in OWN_FLAGS and name else path


def describe(changes: list[tuple[str, object, object]]) -> str:
    """`--steps was 6, now 8; ...`, one entry per option."""
    named: dict[str, str] = {}
    for path, saved, wanted in changes:
        flag = flag_of(path)
        named.setdefault(flag, f"{flag} was {json.dumps(saved)}, now {json.dumps(wanted)}")
    return "; ".join(named.values())


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        raise ForetellError(f"{path} is corrupt; delete it, or rerun with --no-resume to start over") from None


class FeatureRun:
    """One run of a kind trained on cached features, in two phases. Reading (the constructor, then read): the
    target, the run folder's stored settings against this run's, the held-out data and the frozen target; every
    check is here, so a refused run writes nothing. Writing (data, then features): the training data, and the
    feature cache of `layers` (the target layers the kind's `layers_path` option sets, e.g. head.fuse_layers).
    With --features-from RUN both come from RUN's folder and are only read."""

    def __init__(self, cfg, ctx: DistContext | None = None):
        self.cfg, self.ctx = cfg, ctx or DistContext()
        cfg.train.micro_batches(self.ctx.world_size)  # a bad split fails before anything is read or written
        self.target_dir = self.ctx.first(resolve_model_dir, cfg.target)  # a preset may be fetched or converted once
        self.tokenizer = load_tokenizer(self.target_dir)
        self.target_config = ModelConfig.from_file(self.target_dir / "config.json")
        source = cfg.features_from or cfg.out
        self.data_dir, self.features_dir = source / "data", source / "features"

    def cached_layers(self) -> tuple[int, ...] | None:
        """The layers of --features-from's cache: the default of a kind's layer option when it reads one."""
        meta = read_meta(self.features_dir) if self.cfg.features_from is not None else None
        return tuple(meta["fuse_layers"]) if meta is not None else None

    def read(self, settings: dict, layers, layers_path: str) -> tuple[TokenData | None, torch.nn.Module]:
        """Check the run folder against `settings` (this run's train/job.json) on every process, each reading the
        same files before any of them writes; then the held-out data (None without evaluation, and on every
        process but the main one) and the frozen target (on ctx.device)."""
        self.layers, self.layers_path = tuple(layers), layers_path
        if self.cfg.features_from is not None:
            self.check_features_from()
        if self.cfg.resume:
            self.check_run_folder(settings)
        self.ctx.barrier()
        held_out = eval_data(self.cfg, self.tokenizer) if self.ctx.is_main else None
        target = build_model(self.target_dir, torch.float32, self.ctx.device)
        target.requires_grad_(False)  # frozen: only the drafter trains
        return held_out, target

    def check_run_folder(self, settings: dict) -> None:
        """Refuse a run folder whose training or feature cache was made with other settings, naming the options
        that differ (--no-resume starts those parts over instead). The data alone is not checked: nothing is
        trained on it before train/job.json binds the folder, so it is remade."""
        saved = read_json(self.cfg.out / "train" / JOB)
        changes = [] if saved is None else differences(saved, json.loads(json.dumps(settings, default=str)))
        if self.cfg.features_from is None:
            changes += self.cache_changes()
        if changes:
            raise ForetellError(f"{self.cfg.out} holds a run made with other settings ({describe(changes)}); rerun "
                                "with --no-resume to start over there (keeping what still fits), or give another --out")

    def check_features_from(self) -> None:
        """--features-from RUN: its data and a finished feature cache, made with this run's data options, top-k,
        dtype and layers (read, never rewritten)."""
        source = self.cfg.features_from
        data, meta = read_json(self.data_dir / SETTINGS), read_meta(self.features_dir)
        if data is None or meta is None or meta["done"] != meta["num_sequences"]:
            raise ForetellError(f"--features-from {source}: it holds no finished data and feature cache "
                                f"({self.data_dir}, {self.features_dir}); finish that run first")
        changes = differences({"data": data}, {"data": asdict(self.cfg.data)}) + self.cache_changes()
        if changes:
            raise ForetellError(f"--features-from {source}: its data or feature cache was made with other settings "
                                f"({describe(changes)}); give the options it was made with")

    def cache_changes(self) -> list[tuple[str, object, object]]:
        """How the feature cache (if any) differs from what this run needs. The target's weights are compared
        when the cache is opened (features), as comparing them costs a pass over the weights."""
        meta = read_meta(self.features_dir)
        if meta is None:
            return []
        top_k = min(self.cfg.features.top_k, self.target_config.vocab_size)
        return differences(self.cache_view(meta["fingerprint"]["data"], meta["top_k"], meta["fingerprint"]["dtype"],
                                           meta["fuse_layers"]),
                           self.cache_view(asdict(self.cfg.data), top_k, self.cfg.features.dtype, list(self.layers)))

    def cache_view(self, data: dict, top_k: int, dtype: str, layers: list) -> dict:
        """A cache's settings in the shape of train/job.json, so that they are named by the same options."""
        group, _, name = self.layers_path.partition(".")
        return json.loads(json.dumps({"data": data, "features": {"top_k": top_k, "dtype": dtype},
                                      group: {name: layers} if name else layers}))

    def data(self) -> TokenData:
        """The training data: made once (by the main process) in OUT/data, or read from --features-from's run."""
        if self.cfg.features_from is not None:
            return TokenData.load(self.data_dir / "train.safetensors")
        return self.ctx.first(prepare_data, self.cfg.data, self.tokenizer, self.data_dir)

    def features(self, target, data: TokenData) -> FeatureCache:
        """The feature cache of the layers given to read: OUT/features (--no-resume remakes one made with other
        settings), or --features-from's (only read)."""
        return prepare_features(self.cfg, self.target_dir, target, data, self.layers, self.ctx, self.features_dir,
                                shared=self.cfg.features_from is not None, start_over=not self.cfg.resume)

    def train_or_load(self, settings: dict, what: str, target, held_out: TokenData | None, warm_start: Path | None,
                      load, new, train, save, evaluate) -> Path:
        """OUT/<what> (train_or_load below), after read: the module starts from the warm start (load(warm_start,
        target), read before anything is written) or new(data), and train(module, cache, data, job_dir) -> steps
        trains it on the feature cache; save(module, folder) writes it; evaluate(module, data, held_out) follows
        unless there is no held-out data."""
        start = load(warm_start, target) if warm_start is not None else None
        data = self.data()

        def train_new(job_dir: Path):
            cache = self.features(target, data)
            module = start if start is not None else new(data)
            return module, train(module, cache, data, job_dir)

        evaluation = None if held_out is None else lambda module: evaluate(module, data, held_out)
        return train_or_load(self.cfg, settings, what, lambda folder: load(folder, target), train_new, save,
                             evaluation, self.ctx)


def prepare_data(cfg: DataConfig, tokenizer, folder: Path) -> TokenData:
    path, settings = folder / "train.safetensors", folder / SETTINGS
    want = json.dumps(asdict(cfg), sort_keys=True)
    if path.is_file() and settings.is_file() and settings.read_text() == want and (folder / REPORT).is_file():
        return TokenData.load(path)
    report = DataReport()
    data = build_token_data(cfg, tokenizer, report)
    folder.mkdir(parents=True, exist_ok=True)
    data.save(path)
    (folder / REPORT).write_text(json.dumps({"sequences": len(data), **asdict(report)}, indent=2) + "\n")
    settings.write_text(want)
    print(f"foretell train: {len(data)} sequences of {cfg.seq_len} tokens, {int(data.loss_mask.sum())} trained positions "
          f"({', '.join(f'{k}: {v}' for k, v in report.rows.items())}); {report.heldout_dropped} conversations "
          "dropped for sharing text with an evaluation prompt"
          + (f" (not installed, so not checked: {', '.join(report.unchecked)})" if report.unchecked else ""))
    return data


def eval_data(cfg, tokenizer) -> TokenData | None:
    if cfg.eval_sequences == 0:
        return None
    source = cfg.eval_data or cfg.data.source
    return build_token_data(DataConfig(source, "test", cfg.eval_sequences, cfg.data.seq_len, cfg.data.pack), tokenizer)


def prepare_features(cfg, target_dir: Path, target, data: TokenData, fuse_layers, ctx: DistContext | None = None,
                     folder: Path | None = None, shared: bool = False, start_over: bool = False) -> FeatureCache:
    """The feature cache in `folder` (default OUT/features) for the target layers `fuse_layers`: reused when
    complete and made for these settings, else made (each process computing its share of a missing pass).
    `shared`: another run's cache, which is never written; `start_over`: one made with other settings is removed
    first (--no-resume)."""
    folder = folder or cfg.out / "features"
    fingerprint = json.loads(json.dumps(
        {"target": fingerprint_of(target_dir), "data": asdict(cfg.data), "dtype": cfg.features.dtype}))
    k = min(cfg.features.top_k, target.config.vocab_size)
    want = cache_settings(data, tuple(fuse_layers), k, fingerprint)
    cache = open_if_complete(folder, want)
    if cache is not None:
        return cache  # complete and made for these settings: no target pass
    if shared:
        raise ForetellError(f"the feature cache in {folder} was made for another target (other weights); give "
                            "--features-from a run of this target")
    if start_over and (ctx is None or ctx.is_main):
        remove_stale_cache(folder, want)
    if ctx is not None:
        ctx.barrier()
    dtype = parse_dtype(cfg.features.dtype)
    extractor = target if dtype == target.dtype else build_model(target_dir, dtype, target.device)
    # bf16 without a native bf16 matmul: its 320-row passes in fp32 (~7x faster on AVX2); PyTorch's path otherwise
    prepare(extractor, RuntimeConfig(device=str(extractor.device), dtype=dtype, quant=None, bf16_as_float32=False,
                                     lean=False))
    return build_feature_cache(extractor, data, tuple(fuse_layers), folder, cfg.features, fingerprint, ctx)


def remove_stale_cache(folder: Path, want: dict) -> None:
    """A cache made with other settings goes (a link to another run's cache is unlinked, that cache kept), so
    that the pass is made again for this run."""
    meta = read_meta(folder)
    if meta is None or {key: meta.get(key) for key in want} == want:
        return
    print(f"foretell train: --no-resume: the feature cache in {folder} was made with other settings; making it again")
    if folder.is_symlink():
        folder.unlink()
    else:
        (folder / META).unlink()  # first, so an interrupted removal leaves no cache that looks whole
        shutil.rmtree(folder)


def check_same_shape(option: str, folder: Path, saved, wanted, options: str) -> None:
    """A warm start (`option` FOLDER) must have exactly the config this run trains; `options` name the
    flags that set it. The config readers name a missing or unreadable folder themselves."""
    if saved != wanted:
        differ = [k for k, v in asdict(wanted).items() if asdict(saved)[k] != v]
        raise ForetellError(f"{option} {folder} has another shape ({', '.join(differ)} differ); pass the same "
                            f"{options} it was trained with")


def job_settings(cfg, target_dir: Path, **kind) -> dict:
    """What a run's training folder is bound to (train_or_load's `settings`): the target and data, the kind's
    own entries (its module's config, ...), its loss, the feature pass and the schedule."""
    return {"target": str(target_dir), "data": asdict(cfg.data), **kind, "loss": asdict(cfg.loss),
            "features": asdict(cfg.features), "train": asdict(cfg.train)}


def train_or_load(cfg, settings: dict, what: str, load, train_new, save, evaluate=None,
                  ctx: DistContext | None = None) -> Path:
    """OUT/<what>, the run's trained module: loaded from there when this run already finished it, else trained.

    The settings are checked against the run folder's first (FeatureRun.read refused other settings before
    anything was written; --no-resume clears the folder). train_new(job_dir) -> (module, steps done) trains and
    checkpoints into job_dir; save(module, folder) writes the result; evaluate(module), when given, then evaluates it. When training stopped early on
    purpose (the same command resumes) there is no module yet: nothing is saved or evaluated.
    """
    job = SettingsJob(cfg.out / "train", cfg.resume, json.loads(json.dumps(settings, default=str)))
    folder = cfg.out / what
    if not cfg.resume and (folder / "model.safetensors").is_file() and (ctx is None or ctx.is_main):
        print(f"foretell train: --no-resume: the {what} saved earlier in {folder} is replaced when this run finishes")
    if ctx is None:
        open_job_folder(job)
    else:  # one process checks (or clears) and writes the folder, the others wait: they raced on job.json
        ctx.main_only(open_job_folder, job)
    if (job.out / DONE).is_file() and folder.is_dir():
        print(f"foretell train: the {what} in {folder} is already trained, skipping")
        module = load(folder)
    else:
        module, steps = train_new(job.out)
        if steps < cfg.train.steps:
            return folder
        save(module, folder)
        (job.out / DONE).write_text(json.dumps({"steps": steps}))
    if evaluate is not None:
        evaluate(module)
    return folder
