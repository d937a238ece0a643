"""`foretell train hidden-state` end to end: data -> target features (once) -> training -> OUT/draft -> eval.

OUT/
  data/train.safetensors   token ids and assistant mask, with data.json (common/feature_run.py)
  features/                the target's final-normed last-layer states (bf16) and top-k log p per token
                           (common/features.py with the one hook layer L = num_layers), resumable
  train/                   job.json, checkpoint.pt, log.jsonl, loss.png, done.json
  draft/                   the trained draft (save_hidden_draft): foretell generate --hidden-draft OUT/draft
  eval.json, eval.md       held-out per-depth hidden MSE and acceptance, and the hot-vocabulary coverage
Rerunning the same command resumes: finished parts are skipped, training continues from its checkpoint.
The target is frozen (requires_grad off): its shared embedding and output layer get no gradient.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from foretell.errors import ForetellError
from foretell.models.hidden_draft import (
    HiddenDraftConfig,
    load_hidden_draft,
    new_hidden_draft,
    read_hidden_draft_config,
    save_hidden_draft,
)
from foretell.train.common.data import TokenData
from foretell.train.common.distributed import DistContext
from foretell.train.common.draft_vocab import new_draft_vocabulary
from foretell.train.common.feature_run import FeatureRun, FeatureRunConfig, check_same_shape, feature_schedule, job_settings
from foretell.train.common.trainer import TrainConfig
from foretell.train.hidden_state.eval import format_coverage, format_hidden_table, hidden_depth_eval, hot_vocab_coverage
from foretell.train.hidden_state.loss import HiddenLossConfig
from foretell.train.hidden_state.train import train_hidden

INIT_CHOICES = "middle (num_layers // 2), random, or a target layer number (0-based)"


def default_hidden_train() -> TrainConfig:
    # A smaller step than a fresh head's: the draft starts from a pretrained target layer.
    return feature_schedule(lr=5e-4)


@dataclass(frozen=True)
class HiddenShape:
    depth: int = 5  # unrolled steps once the curriculum is through = the drafter's tree depth (seed: 5)
    token_info_rank: int = 256  # r of W_1 [H, r] and W_2 [r, V]; 0 = no token-info
    init_layer: str = "middle"  # see INIT_CHOICES
    draft_vocab: int = 0  # the draft's own vocabulary (HiddenDraftConfig.draft_vocab_size); 0 = the target's

    def __post_init__(self):
        if self.depth < 1:
            raise ForetellError(f"--depth must be >= 1, got {self.depth}")
        if self.draft_vocab < 0:
            raise ForetellError(f"--draft-vocab must be >= 0 (0 = the whole vocabulary), got {self.draft_vocab}")
        if self.token_info_rank < 0:
            raise ForetellError(f"--token-info-rank must be >= 0, got {self.token_info_rank}")
        if self.init_layer not in ("middle", "random") and not self.init_layer.lstrip("-").isdigit():
            raise ForetellError(f"--init-layer takes {INIT_CHOICES}; got {self.init_layer!r}")

    def init_from(self, num_layers: int) -> int | None:
        if self.init_layer == "random":
            return None
        return num_layers // 2 if self.init_layer == "middle" else int(self.init_layer)


@dataclass(frozen=True)
class HiddenStateTrainConfig(FeatureRunConfig):
    shape: HiddenShape = field(default_factory=HiddenShape)
    loss: HiddenLossConfig = field(default_factory=HiddenLossConfig)
    train: TrainConfig = field(default_factory=default_hidden_train)
    hot_vocab_sizes: tuple[int, ...] = (4096, 8192, 16384, 32768)  # coverage reported for each
    width: int = 3  # children per node in the drafter's tree: the eval's top-`width` column
    init_draft: Path | None = None  # warm start: continue from a trained draft of the same shape


def evaluate(cfg: HiddenStateTrainConfig, target, draft, train_data: TokenData, held_out: TokenData) -> dict:
    source = cfg.eval_data or cfg.data.source
    result = {"data": source, "split": "test", **hidden_depth_eval(target, draft, held_out, cfg.shape.depth, cfg.width),
              "hot_vocab": hot_vocab_coverage(train_data, held_out, cfg.hot_vocab_sizes, target.config.vocab_size)}
    (cfg.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    text = f"{format_hidden_table(result)}\n\n{format_coverage(result['hot_vocab'])}"
    (cfg.out / "eval.md").write_text(f"# Hidden-state draft on held-out {source}\n\n{text}\n")
    print(text)
    return result


def check_init_draft(folder: Path, config: HiddenDraftConfig) -> None:
    """--init-draft must name a saved draft of exactly the shape this run trains (same target)."""
    check_same_shape("--init-draft", folder, read_hidden_draft_config(folder), config, "--token-info-rank and --draft-vocab")


def run_hidden_state(cfg: HiddenStateTrainConfig, ctx: DistContext | None = None) -> Path:
    """Train (or finish training) the draft, data-parallel over the processes of `ctx`; returns OUT/draft."""
    run = FeatureRun(cfg, ctx)
    ctx, model = run.ctx, run.target_config
    config = HiddenDraftConfig.for_target(model, token_info_rank=cfg.shape.token_info_rank,
                                          draft_vocab_size=min(cfg.shape.draft_vocab, model.vocab_size))
    init_layer = cfg.shape.init_from(model.num_hidden_layers)
    if init_layer is not None and not 0 <= init_layer < model.num_hidden_layers:
        raise ForetellError(f"--init-layer must be a target layer in 0..{model.num_hidden_layers - 1}, got {init_layer}")
    settings = job_settings(cfg, run.target_dir, draft=asdict(config), init_layer=init_layer, shape=asdict(cfg.shape))
    if cfg.loss.deep_rows == "all":  # the default, left out so runs made before the option still resume
        del settings["loss"]["deep_rows"]
    if not config.draft_vocab_size:  # likewise
        del settings["draft"]["draft_vocab_size"], settings["shape"]["draft_vocab"]
    if cfg.init_draft is not None:  # only when set, so runs made before the option still resume
        check_init_draft(cfg.init_draft, config)
        settings["init_draft"] = str(cfg.init_draft)
    # the one layer the draft reads (the final norm's), which no option sets
    held_out, target = run.read(settings, (config.target_num_layers,), "layers")

    def new_draft(data: TokenData):
        vocab = new_draft_vocabulary(run.tokenizer, data, config.draft_vocab_size, config.vocab_size)
        return new_hidden_draft(target, config, seed=cfg.train.seed, init_from_layer=init_layer, draft_vocab=vocab)

    def train(draft, cache, data: TokenData, job_dir: Path) -> int:
        return train_hidden(draft, cache, data, cfg.train, cfg.loss, cfg.shape.depth, job_dir, cfg.resume,
                            cfg.stop_after, ctx)

    return run.train_or_load(settings, "draft", target, held_out, cfg.init_draft, load_hidden_draft, new_draft, train,
                             save_hidden_draft, lambda draft, data, held_out: evaluate(cfg, target, draft, data, held_out))
