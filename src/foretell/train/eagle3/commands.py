"""`foretell train eagle3`: its own options (after the shared ones of common/options.py) and the command."""

from __future__ import annotations

from pathlib import Path

from foretell.train.common.feature_run import feature_schedule
from foretell.train.common.options import (
    add_feature_kind_arguments, add_head_arguments, add_option_table, check_positive, run_feature_kind, run_settings,
)
from foretell.train.eagle3.loss import Eagle3LossConfig
from foretell.train.eagle3.pipeline import Eagle3Shape, Eagle3TrainConfig, run_eagle3
from foretell.train.parallel_head.commands import parse_layers

HELP = "an EAGLE-3 head: one layer over fused target hidden states, autoregressive, with a draft vocabulary"
DESCRIPTION = """
Builds chat-templated training sequences, runs the target once over them to cache the hidden states of the aux
layers and the target's top-k next-token log-probs (OUT/features, bf16; --features-from reads another run's
instead), picks the draft vocabulary (the most drafted target tokens of the training data: d2t /
t2d), trains the head with EAGLE-3's training-time test (--ttt-steps unrolled steps, each fed its previous
output; KL to the target restricted to the draft vocabulary, step j weighted decay^j; the target stays frozen),
saves OUT/head (use: foretell generate --eagle OUT; export: foretell export eagle3) and writes per-depth
acceptance on held-out data to OUT/eval.json. Rerunning the same command resumes; under torchrun it trains
data-parallel.
"""  # argparse rewraps it


def add_arguments(p) -> None:
    shape, loss = Eagle3Shape(), Eagle3LossConfig()
    g = add_feature_kind_arguments(p, feature_schedule(), Eagle3TrainConfig.eval_sequences, "eagle3 options")
    g.add_argument("--aux-layers", help="comma list of 3 target layers fused by fc, in foretell's indexing (0 = "
                   "embeddings, i = output of layer i, L = final norm; the engines read 1..L-1) (default: EAGLE-3's "
                   "2, L/2, L-3, e.g. 2,15,27 for 30 layers)")
    add_option_table(g, [
        ("--draft-vocab", int, shape.draft_vocab, "draft vocabulary size: the most drafted tokens of the training data"),
        ("--ttt-steps", int, loss.ttt_steps, "training-time test: draft steps unrolled per anchor (EAGLE-3 uses 7)"),
        ("--step-decay", float, loss.step_decay, "loss weight of unrolled step j is decay^j, in (0, 1]"),
        ("--eval-depth", int, Eagle3TrainConfig.eval_depth, "depths of the held-out evaluation"),
    ])
    add_head_arguments(g, loss.anchors)


def eagle3_config(args):
    check_positive(draft_vocab=args.draft_vocab, ttt_steps=args.ttt_steps, anchors=args.anchors,
                   eval_depth=args.eval_depth)
    settings = run_settings(args, feature_schedule())
    layers = parse_layers(args.aux_layers, "--aux-layers")
    return Eagle3TrainConfig(
        **settings, eval_depth=args.eval_depth, shape=Eagle3Shape(args.draft_vocab, layers),
        loss=Eagle3LossConfig(args.ttt_steps, args.step_decay, args.anchors),
        init_head=Path(args.init_head) if args.init_head else None,
    )


def run(args) -> None:
    cfg = eagle3_config(args)
    if run_feature_kind(run_eagle3, cfg, args):
        print(f"head: {cfg.out / 'head'}")
