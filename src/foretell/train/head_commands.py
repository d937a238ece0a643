"""`foretell train <what>`: argument parsing. `parallel-head` here, `hidden-state` in hidden_commands.py; both share
add_run_arguments / run_settings."""

from __future__ import annotations

import argparse
from pathlib import Path

from foretell.errors import ForetellError

WHAT = ("parallel-head", "hidden-state")


def add_train_parser(sub) -> None:
    from foretell.train.hidden_commands import add_hidden_state_parser

    t = sub.add_parser("train", help="train a drafter for a target: parallel-head, hidden-state",
                       description="Train a drafter that reads the target's hidden states. Kinds: " + ", ".join(WHAT) + ".")
    kinds = t.add_subparsers(dest="train_command", required=True, metavar="KIND")
    add_parallel_head_parser(kinds)
    add_hidden_state_parser(kinds)


def add_run_arguments(p, train, eval_sequences: int) -> None:
    """The options every kind shares: target, data, the target's feature pass, the schedule, the run folder.
    `train` (a TrainConfig) and `eval_sequences` are the kind's defaults."""
    from foretell.train.data import DataConfig
    from foretell.train.head_features import FeatureConfig

    data, feats = DataConfig(), FeatureConfig()
    p.add_argument("--target", default="smollm2-135m", help="target model: preset, .gguf or HF folder (default: %(default)s)")
    p.add_argument("--data", default=data.source,
                   help="gsm8k | sharegpt | both (half each) | a .jsonl file of {question, answer} or {messages} (default: %(default)s)")
    p.add_argument("--num-sequences", type=int, help="training sequences to build (default: all the data gives)")
    p.add_argument("--seq-len", type=int, default=data.seq_len, help="tokens per training sequence (default: %(default)s)")
    p.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                   help="pack conversations back to back (default: on for sharegpt, off otherwise)")
    p.add_argument("--eval-data", help="held-out data for the per-depth table: gsm8k | sharegpt | both (test splits) "
                   "| a .jsonl file (default: the test split of --data)")
    p.add_argument("--eval-sequences", type=int, default=eval_sequences,
                   help="held-out sequences for OUT/eval.json, 0 = skip (default: %(default)s)")
    p.add_argument("--topk-teacher", type=int, default=feats.top_k, help="target log-probs cached per token (default: %(default)s)")
    p.add_argument("--feature-dtype", default=feats.dtype, choices=("float32", "bfloat16"),
                   help="dtype of the target's feature pass (default: %(default)s)")
    p.add_argument("--feature-batch", type=int, default=feats.batch_size,
                   help="sequences per target forward in the feature pass (default: %(default)s)")
    p.add_argument("--steps", type=int, default=train.steps, help="optimizer steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=train.batch_size, help="sequences per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=train.lr, help="peak learning rate (default: %(default)s)")
    p.add_argument("--warmup", type=int, help="warmup steps (default: 10%% of --steps)")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the drafter's matmuls (weights stay float32)")
    p.add_argument("--checkpoint-every", type=int, default=train.checkpoint_every, help="steps between checkpoints (default: %(default)s)")
    p.add_argument("--seed", type=int, default=train.seed, help="drafter init, data order and sampling (default: %(default)s)")
    p.add_argument("--out", required=True, help="run folder; the same folder again resumes")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from the checkpoint and skip finished parts (default: on); --no-resume retrains "
                   "(keeps the feature cache)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def run_settings(args, train):
    """Check the shared options; returns (DataConfig, FeatureConfig, TrainConfig) from them (`train`: the kind's defaults)."""
    from dataclasses import replace

    from foretell.train.data import DataConfig
    from foretell.train.head_features import FeatureConfig
    from foretell.train.head_pipeline import check_positive

    check_positive(num_sequences=args.num_sequences, seq_len=args.seq_len, topk_teacher=args.topk_teacher,
                   feature_batch=args.feature_batch, steps=args.steps, batch_size=args.batch_size,
                   checkpoint_every=args.checkpoint_every, threads=args.threads)
    if args.seq_len < 3:
        raise ForetellError(f"--seq-len must be >= 3 (an anchor needs two tokens after it), got {args.seq_len}")
    if args.eval_sequences < 0:
        raise ForetellError(f"--eval-sequences must be >= 0, got {args.eval_sequences}")
    if not args.lr > 0:
        raise ForetellError(f"--lr must be > 0, got {args.lr}")
    if args.warmup is not None and args.warmup < 0:
        raise ForetellError(f"--warmup must be >= 0, got {args.warmup}")
    train = replace(train, steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup,
                    bf16=args.bf16, checkpoint_every=args.checkpoint_every, seed=args.seed)
    data = DataConfig(args.data, "train", args.num_sequences, args.seq_len, args.pack)
    return data, FeatureConfig(args.topk_teacher, args.feature_batch, args.feature_dtype), train


def add_parallel_head_parser(kinds) -> None:
    from foretell.train.head_pipeline import HeadShape, ParallelHeadTrainConfig, default_train
    from foretell.train.head_train import HeadLossConfig

    p = kinds.add_parser(
        "parallel-head", help="a parallel draft head: D tokens per forward from the target's hidden states",
        description="Builds chat-templated training sequences, runs the target once over them to cache the hidden "
        "states of the head's fuse layers and the target's top-k next-token log-probs (OUT/features, bf16), trains "
        "the head on all depths 1..D at sampled anchors (KL to the target's distribution, depth d weighted "
        "decay^(d-1); the target stays frozen), saves OUT/head (use: foretell generate --head OUT/head) and writes "
        "per-depth acceptance on held-out data to OUT/eval.json. Rerunning the same command resumes.",
    )
    shape, loss = HeadShape(), HeadLossConfig()
    add_run_arguments(p, default_train(), ParallelHeadTrainConfig.eval_sequences)
    p.add_argument("--depth", type=int, default=shape.depth, help="D, tokens drafted per head forward (default: %(default)s)")
    p.add_argument("--head-layers", type=int, default=shape.num_layers, help="decoder layers of the head (default: %(default)s)")
    p.add_argument("--fuse-layers", help="comma list of target layers fused into the head's input, 0 = embeddings, "
                   "L = final norm (default: low, middle and high, e.g. 2,15,28 for 30 layers)")
    p.add_argument("--anchors", type=int, default=loss.anchors, help="anchors sampled per sequence per step (default: %(default)s)")
    p.add_argument("--depth-decay", type=float, default=loss.depth_decay,
                   help="loss weight of depth d is decay^(d-1), in (0, 1] (default: %(default)s)")
    p.add_argument("--init-head", help="start from this trained head (a saved OUT/head of the same shape) instead of "
                   "a random one: train longer with a fresh schedule")


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ForetellError(f"--fuse-layers takes comma-separated layer numbers, got {text!r}") from None


def parallel_head_config(args):
    from foretell.train.head_pipeline import HeadShape, ParallelHeadTrainConfig, check_positive, default_train
    from foretell.train.head_train import HeadLossConfig

    check_positive(depth=args.depth, head_layers=args.head_layers, anchors=args.anchors)
    data, features, train = run_settings(args, default_train())
    return ParallelHeadTrainConfig(
        target=args.target, out=Path(args.out), data=data, eval_data=args.eval_data, eval_sequences=args.eval_sequences,
        shape=HeadShape(args.depth, args.head_layers, parse_layers(args.fuse_layers)),
        loss=HeadLossConfig(args.anchors, args.depth_decay), features=features, train=train, resume=args.resume,
        init_head=Path(args.init_head) if args.init_head else None,
    )


def cmd_train(args) -> None:
    import torch

    from foretell.train.head_pipeline import run_parallel_head

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.train_command == "parallel-head":
        cfg = parallel_head_config(args)
        print(f"head: {run_parallel_head(cfg)}")
        return
    if args.train_command == "hidden-state":
        from foretell.train.hidden_commands import hidden_state_config
        from foretell.train.hidden_pipeline import run_hidden_state

        draft_dir = run_hidden_state(hidden_state_config(args))
        print(f"draft: {draft_dir}")
        if args.install:
            from foretell.models.hidden_draft import CONFIG_FILE, install_hidden_draft

            if not (draft_dir / CONFIG_FILE).is_file():
                raise ForetellError(f"--install: {draft_dir} is not trained yet; rerun the command to finish training")
            print(f"installed as the default drafter of {args.target}: {install_hidden_draft(draft_dir, args.target)}")
        return
    raise ForetellError(f"unknown training kind {args.train_command!r}; use one of {', '.join(WHAT)}")
