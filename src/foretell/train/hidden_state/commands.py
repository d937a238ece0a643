"""`foretell train hidden-state`: its own options (after the shared ones of common/options.py) and the command."""

from __future__ import annotations

from pathlib import Path

from foretell.errors import ForetellError
from foretell.models.hidden_draft import CONFIG_FILE, install_hidden_draft
from foretell.train.common.options import add_feature_kind_arguments, add_option_table, run_feature_kind, run_settings
from foretell.train.hidden_state.loss import HiddenLossConfig
from foretell.train.hidden_state.pipeline import (
    INIT_CHOICES, HiddenShape, HiddenStateTrainConfig, default_hidden_train, run_hidden_state,
)


HELP = "a hidden-state draft (Make Every Draft Count): one layer autoregressing on the target's hidden states"
DESCRIPTION = """
Builds chat-templated training sequences, runs the target once over them to cache its final-normed last-layer
hidden states and top-k next-token log-probs (OUT/features, bf16), then trains one decoder layer (initialised
from a middle target layer) to predict the next hidden state from the target's and then its own: loss = w_mse *
MSE(hidden) + w_kl * KL(target || lm_head(predicted) + E(token)), with the token-info factors W_1, W_2 of E
trained through the KL, noise tokens, a curriculum on the unrolled steps and clamped logits; the target stays
frozen. Saves OUT/draft (use: foretell generate --hidden-draft OUT) and writes per-depth hidden MSE and
acceptance on held-out data, and the hot-vocabulary coverage, to OUT/eval.json. Rerunning the same command
resumes.
"""  # argparse rewraps it


def add_arguments(p) -> None:
    cfg, shape, loss = HiddenStateTrainConfig, HiddenShape(), HiddenLossConfig()
    g = add_feature_kind_arguments(p, default_hidden_train(), cfg.eval_sequences, "hidden-state options")
    add_option_table(g, [
        ("--depth", int, shape.depth, "draft steps unrolled once the curriculum is through = the tree depth evaluated"),
        ("--token-info-rank", int, shape.token_info_rank, "rank r of the token-info factors W_1, W_2; 0 = none"),
        ("--init-layer", None, shape.init_layer, f"the draft layer's start: {INIT_CHOICES}"),
        ("--draft-vocab", int, shape.draft_vocab, "train on (and always draft among) the N target tokens drafted "
         "most often in the training data; 0 = the whole vocabulary (a hot vocabulary can still be chosen at load)"),
        ("--mse-weight", float, loss.mse_weight, "weight of the hidden MSE"),
        ("--kl-weight", float, loss.kl_weight, "weight of the KL to the target"),
        ("--noise", float, loss.noise, "share of input rows replaced by another position's hidden state, in [0, 1)"),
        ("--curriculum", float, loss.curriculum,
         "unrolled steps grow from 1 to --depth over this share of the steps; 0 = full depth throughout"),
        ("--logit-clamp", float, loss.logit_clamp, "draft logits are clamped to [-C, C] before the KL"),
        ("--anchors", int, loss.anchors, "anchors per sequence and step for the KL (and, with --deep-rows "
         "anchors, for the deeper unrolled steps)"),
        ("--deep-rows", None, loss.deep_rows, "rows unrolled past the first step: all (the paper's recipe) or anchors "
         "(only the KL anchors: a step ~2x cheaper at depth 5, fewer deep MSE pairs)"),
    ])
    g.add_argument("--init-draft", help="start from this trained draft (a saved OUT/draft of the same shape) instead of "
                   "--init-layer: continues training on a new schedule (pair with --curriculum 0)")
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
    shape = HiddenShape(args.depth, args.token_info_rank, args.init_layer, args.draft_vocab)
    loss = HiddenLossConfig(args.mse_weight, args.kl_weight, args.noise, args.logit_clamp, args.anchors, args.curriculum,
                            args.deep_rows)
    return HiddenStateTrainConfig(
        **run_settings(args, default_hidden_train()), shape=shape, loss=loss,
        hot_vocab_sizes=parse_sizes(args.hot_vocab_sizes), init_draft=Path(args.init_draft) if args.init_draft else None,
    )


def run(args) -> None:
    cfg = hidden_state_config(args)
    if not run_feature_kind(run_hidden_state, cfg, args):
        return
    draft_dir = cfg.out / "draft"
    print(f"draft: {draft_dir}")
    if args.install:
        if not (draft_dir / CONFIG_FILE).is_file():
            raise ForetellError(f"--install: {draft_dir} is not trained yet; rerun the command to finish training")
        print(f"installed as the default drafter of {args.target}: {install_hidden_draft(draft_dir, args.target)}")
