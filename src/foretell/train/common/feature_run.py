"""What a run of a drafter trained on the target's features starts from (parallel head, hidden state, EAGLE-3).

Its training data (data.py: one source or a mix), held-out data, the frozen
target and the feature cache, each made once and reused while its settings hold; and the shape
check of a warm start. `cfg` below is any such kind's run config: a FeatureRunConfig with the kind's
shape, loss and train (its TrainConfig). With several processes (a DistContext) the main process makes the
files and the others read them (ctx.first), the feature pass is sharded, and only the main process
writes the run folder, the trained module and the evaluation.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from foretell.errors import ForetellError
from foretell.models.loading import build_model, load_tokenizer, parse_dtype, resolve_model_dir
from foretell.models.wide_linear import widen_linears
from foretell.train.common.cache import fingerprint_of
from foretell.train.common.data import DataConfig, DataReport, TokenData, build_token_data
from foretell.train.common.distributed import DistContext
from foretell.train.common.features import (
    FeatureCache, FeatureConfig, build_feature_cache, cache_settings, open_if_complete,
)

REPORT = "report.json"  # in OUT/data: rows per source and the evaluation-prompt filter's counts


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


def prepare_data(cfg: DataConfig, tokenizer, folder: Path) -> TokenData:
    path, settings = folder / "train.safetensors", folder / "data.json"
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


def run_inputs(cfg, ctx: DistContext | None = None) -> tuple[Path, TokenData, TokenData | None, torch.nn.Module]:
    """A run's target folder, training data, held-out data (None without evaluation, and on every process but
    the main one) and frozen target (on ctx.device)."""
    ctx = ctx or DistContext()
    cfg.train.micro_batches(ctx.world_size)
    target_dir = ctx.first(resolve_model_dir, cfg.target)  # a preset may be fetched or converted once
    tokenizer = load_tokenizer(target_dir)
    data = ctx.first(prepare_data, cfg.data, tokenizer, cfg.out / "data")  # bad data fails here, before any model work
    held_out = eval_data(cfg, tokenizer) if ctx.is_main else None
    target = build_model(target_dir, torch.float32, ctx.device).requires_grad_(False)  # frozen: only the drafter trains
    return target_dir, data, held_out, target


def prepare_features(cfg, target_dir: Path, target, data: TokenData, fuse_layers,
                     ctx: DistContext | None = None) -> FeatureCache:
    """OUT/features for the target layers `fuse_layers`: reused when complete and made for these settings
    (each process computing its share of a missing pass)."""
    folder = cfg.out / "features"
    fingerprint = json.loads(json.dumps(
        {"target": fingerprint_of(target_dir), "data": asdict(cfg.data), "dtype": cfg.features.dtype}))
    k = min(cfg.features.top_k, target.config.vocab_size)
    cache = open_if_complete(folder, cache_settings(data, tuple(fuse_layers), k, fingerprint))
    if cache is not None:
        return cache  # complete and made for these settings: no target pass
    dtype = parse_dtype(cfg.features.dtype)
    extractor = target if dtype == target.dtype else build_model(target_dir, dtype, target.device)
    widen_linears(extractor)  # bf16 without a native bf16 matmul: its 320-row passes in fp32 (~7x faster on AVX2)
    return build_feature_cache(extractor, data, tuple(fuse_layers), folder, cfg.features, fingerprint, ctx)


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

    The settings are checked against the run folder's first (other settings are refused; --no-resume clears
    it). train_new(job_dir) -> (module, steps done) trains and checkpoints into job_dir; save(module, folder)
    writes the result; evaluate(module), when given, then evaluates it. When training stopped early on
    purpose (the same command resumes) there is no module yet: nothing is saved or evaluated.
    """
    from foretell.train.common.run_folder import DONE, SettingsJob, open_job_folder

    job = SettingsJob(cfg.out / "train", cfg.resume, json.loads(json.dumps(settings, default=str)))
    if ctx is None:
        open_job_folder(job)
    else:  # one process checks (or clears) and writes the folder, the others wait: they raced on job.json
        ctx.main_only(open_job_folder, job)
    folder = cfg.out / what
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
