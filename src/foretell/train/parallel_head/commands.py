"""`foretell train parallel-head`: its own options (after the shared ones of common/options.py) and the command."""

from __future__ import annotations

from pathlib import Path

from foretell.errors import ForetellError


HELP = "a parallel draft head: D tokens per forward from the target's hidden states"
DESCRIPTION = (
    "Builds chat-templated training sequences, runs the target once over them to cache the hidden "
    "states of the head's fuse layers and the target's top-k next-token log-probs (OUT/features, bf16), trains "
    "the head on all depths 1..D at sampled anchors (KL to the target's distribution, depth d weighted "
    "decay^(d-1); the target stays frozen), saves OUT/head (use: foretell generate --head OUT/head) and writes "
    "per-depth acceptance on held-out data to OUT/eval.json. Rerunning the same command resumes."
)


def add_arguments(p) -> None:
    """This kind's options, after the shared ones (common/options.py)."""
    from foretell.train.common.options import add_distributed_arguments, add_feature_arguments, add_run_arguments
    from foretell.train.parallel_head.pipeline import HeadShape, ParallelHeadTrainConfig, default_train
    from foretell.train.parallel_head.train import HeadLossConfig

    shape, loss = HeadShape(), HeadLossConfig()
    add_run_arguments(p, default_train(), ParallelHeadTrainConfig.eval_sequences)
    add_feature_arguments(p)
    add_distributed_arguments(p)
    g = p.add_argument_group("parallel-head options")
    g.add_argument("--depth", type=int, default=shape.depth, help="D, tokens drafted per head forward (default: %(default)s)")
    g.add_argument("--head-layers", type=int, default=shape.num_layers, help="decoder layers of the head (default: %(default)s)")
    g.add_argument("--fuse-layers", help="comma list of target layers fused into the head's input, 0 = embeddings, "
                   "L = final norm (default: low, middle and high, e.g. 2,15,28 for 30 layers)")
    g.add_argument("--anchors", type=int, default=loss.anchors, help="anchors sampled per sequence per step (default: %(default)s)")
    g.add_argument("--depth-decay", type=float, default=loss.depth_decay,
                   help="loss weight of depth d is decay^(d-1), in (0, 1] (default: %(default)s)")
    g.add_argument("--init-head", help="start from this trained head (a saved OUT/head of the same shape) instead of "
                   "a random one: train longer with a fresh schedule")


def parse_layers(text: str | None, flag: str = "--fuse-layers") -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ForetellError(f"{flag} takes comma-separated layer numbers, got {text!r}") from None


def parallel_head_config(args):
    from foretell.train.common.options import check_positive, run_settings
    from foretell.train.parallel_head.pipeline import HeadShape, ParallelHeadTrainConfig, default_train
    from foretell.train.parallel_head.train import HeadLossConfig

    check_positive(depth=args.depth, head_layers=args.head_layers, anchors=args.anchors)
    data, features, train = run_settings(args, default_train())
    return ParallelHeadTrainConfig(
        target=args.target, out=Path(args.out), data=data, eval_data=args.eval_data, eval_sequences=args.eval_sequences,
        shape=HeadShape(args.depth, args.head_layers, parse_layers(args.fuse_layers)),
        loss=HeadLossConfig(args.anchors, args.depth_decay), features=features, train=train, resume=args.resume,
        init_head=Path(args.init_head) if args.init_head else None,
    )


def run(args) -> None:
    import torch

    from foretell.train.common.options import run_distributed
    from foretell.train.parallel_head.pipeline import run_parallel_head

    cfg = parallel_head_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if run_distributed(run_parallel_head, cfg, args):
        print(f"head: {cfg.out / 'head'}")
