"""The training commands' parsers, registered on the main CLI: each sets `run` (args -> None)."""

from __future__ import annotations


def add_training_parsers(sub) -> None:
    from foretell.train.commands import add_distill_parser, add_eval_draft_parser, cmd_distill, cmd_eval_draft
    from foretell.train.head_commands import add_train_parser, cmd_train
    from foretell.train.self_data import add_self_data_parser, cmd_self_data

    add_distill_parser(sub)
    add_eval_draft_parser(sub)
    add_train_parser(sub)
    add_self_data_parser(sub)
    for name, run in (("distill", cmd_distill), ("eval-draft", cmd_eval_draft), ("train", cmd_train),
                      ("self-data", cmd_self_data)):
        sub.choices[name].set_defaults(run=run)
