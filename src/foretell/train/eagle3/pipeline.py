"""`foretell train eagle3` end to end: data -> target features (once) -> training -> OUT/head -> eval.

OUT/
  data/train.safetensors   token ids and assistant mask (common/feature_run.py), with data.json (its settings)
  features/                the aux layers' target hidden states and top-k p per token (common/features.py):
                           the cache a parallel-head run with the same layers and data makes; --features-from
                           RUN reads RUN's data and features instead of making these two
  train/                   job.json, checkpoint.pt, log.jsonl, loss.png, done.json
  head/                    the trained head (save_eagle3_head): foretell generate --eagle OUT/head;
                           `foretell export eagle3` writes it for vLLM and SGLang
  eval.json, eval.md       per-depth acceptance on held-out data, the draft vocabulary's coverage
Rerunning the same command resumes: finished parts are skipped, training continues from its checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from foretell.models.config import ModelConfig
from foretell.models.eagle3 import (
    DEFAULT_DRAFT_VOCAB, Eagle3Config, new_eagle3_head, read_eagle3_config, save_eagle3_head,
)
from foretell.models.eagle3_format import load_eagle3_head
from foretell.train.common.data import TokenData
from foretell.train.common.depths import format_depth_table
from foretell.train.common.distributed import DistContext
from foretell.train.common.draft_vocab import new_draft_vocabulary
from foretell.train.common.feature_run import FeatureRun, FeatureRunConfig, check_same_shape, feature_schedule, job_settings
from foretell.train.common.trainer import TrainConfig
from foretell.train.eagle3.eval import eagle3_depth_eval
from foretell.train.eagle3.loss import Eagle3LossConfig
from foretell.train.eagle3.train import train_eagle3


@dataclass(frozen=True)
class Eagle3Shape:
    draft_vocab: int = DEFAULT_DRAFT_VOCAB  # draft vocabulary size (at most the target's vocabulary)
    aux_layers: tuple[int, ...] | None = None  # None: EAGLE-3's low / middle / high layers (2, L // 2, L - 3)


@dataclass(frozen=True)
class Eagle3TrainConfig(FeatureRunConfig):
    eval_depth: int = 5  # depths evaluated (the drafter's default tree depth)
    shape: Eagle3Shape = field(default_factory=Eagle3Shape)
    loss: Eagle3LossConfig = field(default_factory=Eagle3LossConfig)
    train: TrainConfig = field(default_factory=feature_schedule)  # the parallel head's: both heads start fresh
    init_head: Path | None = None  # warm start: continue from a trained head of the same shape


def head_config(cfg: Eagle3TrainConfig, target: ModelConfig, cached_layers=None) -> Eagle3Config:
    """The head this run trains on `target` (its config); its aux layers default to `cached_layers` (those of
    --features-from's cache) when given, else to EAGLE-3's."""
    config = Eagle3Config.for_target(target, cfg.shape.draft_vocab, cfg.shape.aux_layers or cached_layers)
    if cfg.init_head is not None:
        check_same_shape("--init-head", cfg.init_head, read_eagle3_config(cfg.init_head), config,
                         "--draft-vocab and --aux-layers")
    return config


def evaluate(cfg: Eagle3TrainConfig, target, head, held_out: TokenData) -> dict:
    source = cfg.eval_data or cfg.data.source
    result = {"data": source, "split": "test", **eagle3_depth_eval(target, head, held_out, cfg.eval_depth)}
    (cfg.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    table = format_depth_table(result)
    coverage = f"Draft vocabulary ({head.config.draft_vocab_size} tokens) coverage of held-out assistant tokens: " \
               f"{result['draft_vocab_coverage']:.4f}"
    (cfg.out / "eval.md").write_text(f"# EAGLE-3 head: per-depth acceptance on held-out {source}\n\n{table}\n\n{coverage}\n")
    print(f"{table}\n\n{coverage}")
    return result


def run_eagle3(cfg: Eagle3TrainConfig, ctx: DistContext | None = None) -> Path:
    """Train (or finish training) the head, data-parallel over the processes of `ctx`; returns OUT/head."""
    run = FeatureRun(cfg, ctx)
    ctx = run.ctx
    config = head_config(cfg, run.target_config, run.cached_layers())
    settings = job_settings(cfg, run.target_dir, head=asdict(config))
    if cfg.init_head is not None:
        settings["init_head"] = str(cfg.init_head)
    held_out, target = run.read(settings, config.aux_layers, "head.aux_layers")

    def new_head(data: TokenData):
        vocab = new_draft_vocabulary(run.tokenizer, data, config.draft_vocab_size, config.vocab_size)
        return new_eagle3_head(target, config, seed=cfg.train.seed, draft_vocab=vocab)

    def train(head, cache, data: TokenData, job_dir: Path) -> int:
        return train_eagle3(head, cache, data, cfg.train, cfg.loss, job_dir, cfg.resume, cfg.stop_after, ctx)

    return run.train_or_load(settings, "head", target, held_out, cfg.init_head, load_eagle3_head, new_head, train,
                             save_eagle3_head, lambda head, data, held_out: evaluate(cfg, target, head, held_out))
