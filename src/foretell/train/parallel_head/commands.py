"""`foretell train parallel-head`: its own options (after the shared ones of common/options.py) and the command."""

from __future__ import annotations

from pathlib import Path

from foretell.errors import ForetellError
from foretell.train.common.feature_run import feature_schedule
from foretell.train.common.options import (
    add_feature_kind_arguments, add_head_arguments, add_option_table, check_positive, run_feature_kind, run_settings,
)
from foretell.train.parallel_head.pipeline import HeadShape, ParallelHeadTrainConfig, run_parallel_head
from foretell.train.parallel_head.train import HeadLossConfig


HELP = "a parallel draft head: D tokens per forward from the target's hidden states"
DESCRIPTION = """
Builds chat-templated training sequences, runs the target once over them to cache the hidden states of the
head's fuse layers and the target's top-k next-token log-probs (OUT/features, bf16), trains the head on all
depths 1..D at sampled anchors (KL to the target's distribution, depth d weighted decay^(d-1); the target stays
frozen), saves OUT/head (use: foretell generate --head OUT) and writes per-depth acceptance on held-out
data to OUT/eval.json. Rerunning the same command resumes.
"""  # argparse rewraps it


def add_arguments(p) -> None:
    shape, loss = HeadShape(), HeadLossConfig()
    g = add_feature_kind_arguments(p, feature_schedule(), ParallelHeadTrainConfig.eval_sequences, "parallel-head options")
    g.add_argument("--fuse-layers", help="comma list of target layers fused into the head's input, 0 = embeddings, "
                   "L = final norm (default: low, middle and high, e.g. 2,15,28 for 30 layers)")
    add_option_table(g, [
        ("--depth", int, shape.depth, "D, tokens drafted per head forward"),
        ("--head-layers", int, shape.num_layers, "decoder layers of the head"),
        ("--depth-decay", float, loss.depth_decay, "loss weight of depth d is decay^(d-1), in (0, 1]"),
        ("--draft-vocab", int, shape.draft_vocab, "train on (and always draft among) the N target tokens drafted "
         "most often in the training data (a cheaper step on a large vocabulary); 0 = the whole "
         "vocabulary (a hot vocabulary can still be chosen at load)"),
    ])
    add_head_arguments(g, loss.anchors)


def parse_layers(text: str | None, flag: str = "--fuse-layers") -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ForetellError(f"{flag} takes comma-separated layer numbers, got {text!r}") from None


def parallel_head_config(args):
    check_positive(depth=args.depth, head_layers=args.head_layers, anchors=args.anchors)
    if args.draft_vocab < 0:
        raise ForetellError(f"--draft-vocab must be >= 0 (0 = the whole vocabulary), got {args.draft_vocab}")
    shape = HeadShape(args.depth, args.head_layers, parse_layers(args.fuse_layers), args.draft_vocab)
    return ParallelHeadTrainConfig(
        **run_settings(args, feature_schedule()), shape=shape,
        loss=HeadLossConfig(args.anchors, args.depth_decay), init_head=Path(args.init_head) if args.init_head else None,
    )


def run(args) -> None:
    cfg = parallel_head_config(args)
    if run_feature_kind(run_parallel_head, cfg, args):
        print(f"head: {cfg.out / 'head'}")
