"""`foretell train eagle3`: its own options (after the shared ones of common/options.py) and the command."""

from __future__ import annotations

from pathlib import Path

HELP = "an EAGLE-3 head: one layer over fused target hidden states, autoregressive, with a draft vocabulary"
DESCRIPTION = (
    "Builds chat-templated training sequences, runs the target once over them to cache the hidden states of "
    "the aux layers and the target's top-k next-token log-probs (OUT/features, bf16; the same cache as a "
    "parallel-head run with the same layers), picks the draft vocabulary (the most drafted target tokens of the "
    "training data: d2t / t2d), trains the head with EAGLE-3's training-time test (--ttt-steps unrolled steps, "
    "each fed its previous output; KL to the target restricted to the draft vocabulary, step j weighted "
    "decay^j; the target stays frozen), saves OUT/head (use: foretell generate --eagle OUT/head; export: "
    "foretell export eagle3) and writes per-depth acceptance on held-out data to OUT/eval.json. Rerunning the "
    "same command resumes; under torchrun it trains data-parallel."
)


def add_arguments(p) -> None:
    """This kind's options, after the shared ones (common/options.py)."""
    from foretell.train.common.options import add_distributed_arguments, add_feature_arguments, add_run_arguments
    from foretell.train.eagle3.loss import Eagle3LossConfig
    from foretell.train.eagle3.pipeline import Eagle3Shape, Eagle3TrainConfig, default_eagle3_train

    shape, loss = Eagle3Shape(), Eagle3LossConfig()
    add_run_arguments(p, default_eagle3_train(), Eagle3TrainConfig.eval_sequences)
    add_feature_arguments(p)
    add_distributed_arguments(p)
    g = p.add_argument_group("eagle3 options")
    g.add_argument("--aux-layers", help="comma list of 3 target layers fused by fc, in foretell's indexing (0 = "
                   "embeddings, i = output of layer i, L = final norm; the engines read 1..L-1) (default: EAGLE-3's "
                   "2, L/2, L-3, e.g. 2,15,27 for 30 layers)")
    g.add_argument("--draft-vocab", type=int, default=shape.draft_vocab,
                   help="draft vocabulary size: the most drafted tokens of the training data (default: %(default)s)")
    g.add_argument("--ttt-steps", type=int, default=loss.ttt_steps,
                   help="training-time test: draft steps unrolled per anchor (EAGLE-3 uses 7) (default: %(default)s)")
    g.add_argument("--step-decay", type=float, default=loss.step_decay,
                   help="loss weight of unrolled step j is decay^j, in (0, 1] (default: %(default)s)")
    g.add_argument("--anchors", type=int, default=loss.anchors, help="anchors sampled per sequence per step (default: %(default)s)")
    g.add_argument("--eval-depth", type=int, default=Eagle3TrainConfig.eval_depth,
                   help="depths of the held-out evaluation (default: %(default)s)")
    g.add_argument("--init-head", help="start from this trained head (a saved OUT/head of the same shape) instead of "
                   "a new one: train longer with a fresh schedule")


def eagle3_config(args):
    from foretell.train.common.options import check_positive, run_settings
    from foretell.train.eagle3.loss import Eagle3LossConfig
    from foretell.train.eagle3.pipeline import Eagle3Shape, Eagle3TrainConfig, default_eagle3_train
    from foretell.train.parallel_head.commands import parse_layers

    check_positive(draft_vocab=args.draft_vocab, ttt_steps=args.ttt_steps, anchors=args.anchors,
                   eval_depth=args.eval_depth)
    data, features, train = run_settings(args, default_eagle3_train())
    layers = parse_layers(args.aux_layers, "--aux-layers")
    return Eagle3TrainConfig(
        target=args.target, out=Path(args.out), data=data, eval_data=args.eval_data, eval_sequences=args.eval_sequences,
        eval_depth=args.eval_depth, shape=Eagle3Shape(args.draft_vocab, layers),
        loss=Eagle3LossConfig(args.ttt_steps, args.step_decay, args.anchors), features=features, train=train,
        resume=args.resume, init_head=Path(args.init_head) if args.init_head else None,
    )


def run(args) -> None:
    import torch

    from foretell.train.common.options import run_distributed
    from foretell.train.eagle3.pipeline import run_eagle3

    cfg = eagle3_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if run_distributed(run_eagle3, cfg, args):
        print(f"head: {cfg.out / 'head'}")
