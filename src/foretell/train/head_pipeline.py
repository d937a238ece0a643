"""`foretell train parallel-head` end to end: data -> target features (once) -> training -> OUT/head -> eval.

OUT/
  data/train.safetensors   token ids and assistant mask (data.py), with data.json (its settings)
  features/                fused target hidden states and top-k p per token (head_features.py)
  train/                   job.json, checkpoint.pt, log.jsonl, loss.png, done.json
  head/                    the trained head (save_parallel_head): load with foretell.load(target, head=OUT/head)
  eval.json, eval.md       per-depth acceptance on held-out data
Rerunning the same command resumes: finished parts are skipped, training continues from its checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from foretell.errors import ForetellError
from foretell.models.loading import build_model, load_tokenizer, parse_dtype, resolve_model_dir
from foretell.models.parallel_head import (
    ParallelHeadConfig, load_parallel_head, new_parallel_head, read_head_config, save_parallel_head,
)
from foretell.train.data import DataConfig, TokenData, build_token_data
from foretell.train.head_eval import depth_acceptance, format_depth_table
from foretell.train.head_features import FeatureCache, FeatureConfig, build_feature_cache, cache_settings, open_if_complete
from foretell.train.head_train import HeadLossConfig, train_head
from foretell.train.stages import begin_stage
from foretell.train.teacher import fingerprint_of
from foretell.train.trainer import TrainConfig

BOTH = "both"  # GSM8K and ShareGPT, half the sequences each
DONE = "done.json"


def default_train() -> TrainConfig:
    # A fresh one-layer head takes a larger step than a pretrained draft (AdaSPEC's 3e-4).
    return TrainConfig(steps=1000, batch_size=16, micro_batch_size=1, lr=1e-3, checkpoint_every=100)


@dataclass(frozen=True)
class HeadShape:
    depth: int = 4  # D: tokens drafted per head forward
    num_layers: int = 1
    fuse_layers: tuple[int, ...] | None = None  # None: low / middle / high target layers


@dataclass(frozen=True)
class ParallelHeadTrainConfig:
    target: str
    out: Path
    data: DataConfig = field(default_factory=DataConfig)  # source may also be "both"
    eval_data: str | None = None  # None: the test split of data.source (a .jsonl file has no split: give one)
    eval_sequences: int = 64  # 0 = no evaluation
    shape: HeadShape = field(default_factory=HeadShape)
    loss: HeadLossConfig = field(default_factory=HeadLossConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    train: TrainConfig = field(default_factory=default_train)
    resume: bool = True
    stop_after: int | None = None  # stop training early (tests of resuming)
    init_head: Path | None = None  # warm start: continue from a trained head of the same shape


@dataclass(frozen=True)
class HeadJob:
    """What begin_stage needs: the folder, resume, and the settings a checkpoint must share."""

    out: Path
    resume: bool
    settings: dict

    def fingerprint(self) -> dict:
        return self.settings


def token_data(cfg: DataConfig, tokenizer) -> TokenData:
    if cfg.source != BOTH:
        return build_token_data(cfg, tokenizer)
    n = cfg.num_sequences
    parts = [build_token_data(DataConfig(source, cfg.split, None if n is None else max(1, n // 2), cfg.seq_len, cfg.pack),
                              tokenizer) for source in ("gsm8k", "sharegpt")]
    return TokenData(torch.cat([p.input_ids for p in parts]), torch.cat([p.loss_mask for p in parts]))


def prepare_data(cfg: DataConfig, tokenizer, folder: Path) -> TokenData:
    path, settings = folder / "train.safetensors", folder / "data.json"
    want = json.dumps(asdict(cfg), sort_keys=True)
    if path.is_file() and settings.is_file() and settings.read_text() == want:
        return TokenData.load(path)
    data = token_data(cfg, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    data.save(path)
    settings.write_text(want)
    print(f"foretell train: {len(data)} sequences of {cfg.seq_len} tokens, {int(data.loss_mask.sum())} trained positions")
    return data


def head_config(cfg: ParallelHeadTrainConfig, target) -> ParallelHeadConfig:
    s = cfg.shape
    config = ParallelHeadConfig.for_target(target.config, num_layers=s.num_layers, depth=s.depth, fuse_layers=s.fuse_layers)
    if cfg.init_head is not None:
        check_init_head(cfg.init_head, config)
    return config


def check_init_head(folder: Path, config: ParallelHeadConfig) -> None:
    """--init-head must name a saved head of exactly the shape this run trains."""
    check_same_shape("--init-head", folder, read_head_config(folder), config,
                     "--depth, --head-layers and --fuse-layers")


def check_same_shape(option: str, folder: Path, saved, wanted, options: str) -> None:
    """A warm start (`option` FOLDER) must have exactly the config this run trains; `options` name the
    flags that set it. The config readers name a missing or unreadable folder themselves."""
    if saved != wanted:
        differ = [k for k, v in asdict(wanted).items() if asdict(saved)[k] != v]
        raise ForetellError(f"{option} {folder} has another shape ({', '.join(differ)} differ); pass the same "
                            f"{options} it was trained with")


def prepare_features(cfg: ParallelHeadTrainConfig, target_dir: Path, target, data: TokenData, fuse_layers) -> FeatureCache:
    folder = cfg.out / "features"
    fingerprint = json.loads(json.dumps(
        {"target": fingerprint_of(target_dir), "data": asdict(cfg.data), "dtype": cfg.features.dtype}))
    k = min(cfg.features.top_k, target.config.vocab_size)
    cache = open_if_complete(folder, cache_settings(data, tuple(fuse_layers), k, fingerprint))
    if cache is not None:
        return cache  # complete and made for these settings: no target pass
    dtype = parse_dtype(cfg.features.dtype)
    extractor = target if dtype == target.dtype else build_model(target_dir, dtype)
    return build_feature_cache(extractor, data, tuple(fuse_layers), folder, cfg.features, fingerprint)


def eval_data(cfg: ParallelHeadTrainConfig, tokenizer) -> TokenData | None:
    if cfg.eval_sequences == 0:
        return None
    source = cfg.eval_data or cfg.data.source
    return token_data(DataConfig(source, "test", cfg.eval_sequences, cfg.data.seq_len, cfg.data.pack), tokenizer)


def evaluate(cfg: ParallelHeadTrainConfig, target, head, data: TokenData) -> dict:
    source = cfg.eval_data or cfg.data.source
    result = {"data": source, "split": "test", **depth_acceptance(target, head, data)}
    (cfg.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    table = format_depth_table(result)
    (cfg.out / "eval.md").write_text(f"# Parallel head: per-depth acceptance on held-out {source}\n\n{table}\n")
    print(table)
    return result


def run_inputs(cfg) -> tuple[Path, TokenData, TokenData | None, torch.nn.Module]:
    """A run's target folder, training data, held-out data (None without evaluation) and frozen target
    (cfg: any kind's run config with target, out, data, eval_data, eval_sequences and train)."""
    cfg.train.micro_batches(1)
    target_dir = resolve_model_dir(cfg.target)
    tokenizer = load_tokenizer(target_dir)
    data = prepare_data(cfg.data, tokenizer, cfg.out / "data")  # bad data fails here, before any model work
    held_out = eval_data(cfg, tokenizer)
    target = build_model(target_dir, torch.float32).requires_grad_(False)  # frozen: only the drafter trains
    return target_dir, data, held_out, target


def run_parallel_head(cfg: ParallelHeadTrainConfig) -> Path:
    """Train (or finish training) the head; returns OUT/head."""
    target_dir, data, held_out, target = run_inputs(cfg)
    config = head_config(cfg, target)
    if cfg.eval_sequences and cfg.eval_data is None and cfg.data.source not in ("gsm8k", "sharegpt", BOTH):
        print("foretell train: warning: evaluating on the training file (give --eval-data for held-out data)")
    settings = {"target": str(target_dir), "data": asdict(cfg.data), "head": asdict(config), "loss": asdict(cfg.loss),
                "features": asdict(cfg.features), "train": asdict(cfg.train)}
    if cfg.init_head is not None:  # only when set, so runs made before the option still resume
        settings["init_head"] = str(cfg.init_head)
    job = HeadJob(cfg.out / "train", cfg.resume, json.loads(json.dumps(settings, default=str)))
    begin_stage(job)  # refuses a folder trained with other settings; --no-resume clears it
    cache = prepare_features(cfg, target_dir, target, data, config.fuse_layers)
    head_dir = cfg.out / "head"
    if (job.out / DONE).is_file() and head_dir.is_dir():
        print(f"foretell train: the head in {head_dir} is already trained, skipping")
        head = load_parallel_head(head_dir, target)
    else:
        head = (load_parallel_head(cfg.init_head, target) if cfg.init_head is not None
                else new_parallel_head(target, config, seed=cfg.train.seed))
        steps = train_head(head, cache, data, cfg.train, cfg.loss, job.out, cfg.resume, cfg.stop_after)
        if steps < cfg.train.steps:
            return head_dir  # stopped early on purpose; the same command resumes
        save_parallel_head(head, head_dir)
        (job.out / DONE).write_text(json.dumps({"steps": steps}))
    if held_out is not None:
        evaluate(cfg, target, head, held_out)
    return head_dir


def check_positive(**values) -> None:
    for name, v in values.items():
        if v is not None and v < 1:
            raise ForetellError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
