"""`foretell train parallel-head` end to end: data -> target features (once) -> training -> OUT/head -> eval.

OUT/
  data/train.safetensors   token ids and assistant mask (common/feature_run.py), with data.json (its settings)
  features/                fused target hidden states and top-k p per token (common/features.py)
  train/                   job.json, checkpoint.pt, log.jsonl, loss.png, done.json
  head/                    the trained head (save_parallel_head): load with foretell.load(target, head=OUT/head)
  eval.json, eval.md       per-depth acceptance on held-out data
Rerunning the same command resumes: finished parts are skipped, training continues from its checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from foretell.conversations import BOTH
from foretell.models.config import ModelConfig
from foretell.models.parallel_head import (
    ParallelHeadConfig, load_parallel_head, new_parallel_head, read_head_config, save_parallel_head,
)
from foretell.train.common.data import TokenData
from foretell.train.common.depths import format_depth_table
from foretell.train.common.distributed import DistContext
from foretell.train.common.draft_vocab import new_draft_vocabulary
from foretell.train.common.feature_run import FeatureRun, FeatureRunConfig, check_same_shape, feature_schedule, job_settings
from foretell.train.common.trainer import TrainConfig
from foretell.train.parallel_head.eval import depth_acceptance
from foretell.train.parallel_head.train import HeadLossConfig, train_head


@dataclass(frozen=True)
class HeadShape:
    depth: int = 4  # D: tokens drafted per head forward
    num_layers: int = 1
    fuse_layers: tuple[int, ...] | None = None  # None: low / middle / high target layers
    draft_vocab: int = 0  # N > 0: trained on (and drafting among) the N tokens drafted most in the training data


@dataclass(frozen=True)
class ParallelHeadTrainConfig(FeatureRunConfig):
    shape: HeadShape = field(default_factory=HeadShape)
    loss: HeadLossConfig = field(default_factory=HeadLossConfig)
    train: TrainConfig = field(default_factory=feature_schedule)
    init_head: Path | None = None  # warm start: continue from a trained head of the same shape


def head_config(cfg: ParallelHeadTrainConfig, target: ModelConfig, cached_layers=None) -> ParallelHeadConfig:
    """The head this run trains on `target` (its config); its fuse layers default to `cached_layers` (those of
    --features-from's cache) when given, else to low, middle and high layers."""
    s = cfg.shape
    config = ParallelHeadConfig.for_target(target, num_layers=s.num_layers, depth=s.depth,
                                           fuse_layers=s.fuse_layers or cached_layers,
                                           draft_vocab_size=min(s.draft_vocab, target.vocab_size))
    if cfg.init_head is not None:
        check_init_head(cfg.init_head, config)
    return config


def new_head(cfg: ParallelHeadTrainConfig, config: ParallelHeadConfig, tokenizer, target, data: TokenData):
    """Training's start: a new head, over the tokens drafted most often in `data` when it has its own vocabulary."""
    vocab = new_draft_vocabulary(tokenizer, data, config.draft_vocab_size, config.vocab_size)
    return new_parallel_head(target, config, seed=cfg.train.seed, draft_vocab=vocab)


def check_init_head(folder: Path, config: ParallelHeadConfig) -> None:
    """--init-head must name a saved head of exactly the shape this run trains."""
    check_same_shape("--init-head", folder, read_head_config(folder), config,
                     "--depth, --head-layers and --fuse-layers")


def evaluate(cfg: ParallelHeadTrainConfig, target, head, data: TokenData) -> dict:
    source = cfg.eval_data or cfg.data.source
    result = {"data": source, "split": "test", **depth_acceptance(target, head, data)}
    (cfg.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    table = format_depth_table(result)
    (cfg.out / "eval.md").write_text(f"# Parallel head: per-depth acceptance on held-out {source}\n\n{table}\n")
    print(table)
    return result


def run_parallel_head(cfg: ParallelHeadTrainConfig, ctx: DistContext | None = None) -> Path:
    """Train (or finish training) the head, data-parallel over the processes of `ctx`; returns OUT/head."""
    run = FeatureRun(cfg, ctx)
    ctx = run.ctx
    config = head_config(cfg, run.target_config, run.cached_layers())
    if ctx.is_main and cfg.eval_sequences and cfg.eval_data is None and cfg.data.source not in ("gsm8k", "sharegpt", BOTH):
        print("foretell train: warning: evaluating on the training file (give --eval-data for held-out data)")
    settings = job_settings(cfg, run.target_dir, head=asdict(config))
    if cfg.init_head is not None:  # only when set, so runs made before the option still resume
        settings["init_head"] = str(cfg.init_head)
    if not config.draft_vocab_size:  # likewise
        del settings["head"]["draft_vocab_size"]
    held_out, target = run.read(settings, config.fuse_layers, "head.fuse_layers")

    def train(head, cache, data: TokenData, job_dir: Path) -> int:
        return train_head(head, cache, data, cfg.train, cfg.loss, job_dir, cfg.resume, cfg.stop_after, ctx)

    return run.train_or_load(settings, "head", target, held_out, cfg.init_head, load_parallel_head,
                             lambda data: new_head(cfg, config, run.tokenizer, target, data), train,
                             save_parallel_head, lambda head, data, held_out: evaluate(cfg, target, head, held_out))
