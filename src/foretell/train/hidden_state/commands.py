"""`foretell train hidden-state`: its own options (after the shared ones of common/options.py) and the command."""

from __future__ import annotations

from pathlib import Path

from foretell.errors import ForetellError


HELP = "a hidden-state draft (seed 000): one layer autoregressing on the target's hidden states"
DESCRIPTION = (
    "Builds chat-templated training sequences, runs the target once over them to cache its "
    "final-normed last-layer hidden states and top-k next-token log-probs (OUT/features, bf16), then trains one "
    "decoder layer (initialised from a middle target layer) to predict the next hidden state from the target's "
    "and then its own: loss = w_mse * MSE(hidden) + w_kl * KL(target || lm_head(predicted) + E(token)), with the "
    "token-info factors W_1, W_2 of E trained through the KL, noise tokens, a curriculum on the unrolled steps "
    "and clamped logits; the target stays frozen. Saves OUT/draft (use: foretell generate --hidden-draft "
    "OUT/draft) and writes per-depth hidden MSE and acceptance on held-out data, and the hot-vocabulary "
    "coverage, to OUT/eval.json. Rerunning the same command resumes."
)


def add_arguments(p) -> None:
    """This kind's options, after the shared ones (common/options.py)."""
    from foretell.train.common.options import add_distributed_arguments, add_feature_arguments, add_run_arguments
    from foretell.train.hidden_state.loss import HiddenLossConfig
    from foretell.train.hidden_state.pipeline import INIT_CHOICES, HiddenShape, HiddenStateTrainConfig, default_hidden_train

    cfg, shape, loss = HiddenStateTrainConfig, HiddenShape(), HiddenLossConfig()
    add_run_arguments(p, default_hidden_train(), cfg.eval_sequences)
    add_feature_arguments(p)
    add_distributed_arguments(p)
    g = p.add_argument_group("hidden-state options")
    g.add_argument("--depth", type=int, default=shape.depth,
                   help="draft steps unrolled once the curriculum is through = the tree depth evaluated (default: %(default)s)")
    g.add_argument("--token-info-rank", type=int, default=shape.token_info_rank,
                   help="rank r of the token-info factors W_1, W_2; 0 = none (default: %(default)s)")
    g.add_argument("--init-layer", default=shape.init_layer, help=f"the draft layer's start: {INIT_CHOICES} (default: %(default)s)")
    g.add_argument("--init-draft", help="start from this trained draft (a saved OUT/draft of the same shape) instead of "
                   "--init-layer: continues training on a new schedule (pair with --curriculum 0)")
    g.add_argument("--mse-weight", type=float, default=loss.mse_weight, help="weight of the hidden MSE (default: %(default)s)")
    g.add_argument("--kl-weight", type=float, default=loss.kl_weight, help="weight of the KL to the target (default: %(default)s)")
    g.add_argument("--noise", type=float, default=loss.noise,
                   help="share of input rows replaced by another position's hidden state, in [0, 1) (default: %(default)s)")
    g.add_argument("--curriculum", type=float, default=loss.curriculum,
                   help="unrolled steps grow from 1 to --depth over this share of the steps; 0 = full depth "
                   "throughout (default: %(default)s)")
    g.add_argument("--logit-clamp", type=float, default=loss.logit_clamp,
                   help="draft logits are clamped to [-C, C] before the KL (default: %(default)s)")
    g.add_argument("--anchors", type=int, default=loss.anchors,
                   help="anchors per sequence and step for the KL; the MSE uses all (default: %(default)s)")
    g.add_argument("--install", action="store_true",
                   help="once trained, install the draft as the target's default drafter: `foretell generate --model "
                   "TARGET` then uses it (with the adaptive budget, 8192 hot tokens and the prompt-lookup branch)")
    g.add_argument("--hot-vocab-sizes", default=",".join(map(str, cfg.hot_vocab_sizes)),
                   help="hot-vocabulary sizes whose held-out coverage is reported (default: %(default)s)")


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ForetellError(f"--hot-vocab-sizes takes comma-separated sizes >= 1, got {text!r}")
    return sizes


def hidden_state_config(args):
    from foretell.train.common.options import run_settings
    from foretell.train.hidden_state.loss import HiddenLossConfig
    from foretell.train.hidden_state.pipeline import HiddenShape, HiddenStateTrainConfig, default_hidden_train

    shape = HiddenShape(args.depth, args.token_info_rank, args.init_layer)
    loss = HiddenLossConfig(args.mse_weight, args.kl_weight, args.noise, args.logit_clamp, args.anchors, args.curriculum)
    data, features, train = run_settings(args, default_hidden_train())
    return HiddenStateTrainConfig(
        target=args.target, out=Path(args.out), data=data, eval_data=args.eval_data, eval_sequences=args.eval_sequences,
        shape=shape, loss=loss, features=features, train=train, hot_vocab_sizes=parse_sizes(args.hot_vocab_sizes),
        resume=args.resume, init_draft=Path(args.init_draft) if args.init_draft else None,
    )


def run(args) -> None:
    import torch

    from foretell.train.common.options import run_distributed
    from foretell.train.hidden_state.pipeline import run_hidden_state

    cfg = hidden_state_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not run_distributed(run_hidden_state, cfg, args):
        return
    draft_dir = cfg.out / "draft"
    print(f"draft: {draft_dir}")
    if args.install:
        from foretell.models.hidden_draft import CONFIG_FILE, install_hidden_draft

        if not (draft_dir / CONFIG_FILE).is_file():
            raise ForetellError(f"--install: {draft_dir} is not trained yet; rerun the command to finish training")
        print(f"installed as the default drafter of {args.target}: {install_hidden_draft(draft_dir, args.target)}")
