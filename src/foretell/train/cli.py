"""The training commands' parsers, registered on the main CLI: each sets `run` (args -> None).

`foretell train KIND` trains a drafter of one seed family. Every kind is a module with the same shape
(HELP, DESCRIPTION, add_arguments(p), run(args)) and takes the shared options (common/options.py) before its
own. `eval-draft`, `self-data` and `corpus` are the tools around them.
"""

from __future__ import annotations

from importlib import import_module

from foretell.train.adaspec.commands import add_eval_draft_parser, cmd_eval_draft
from foretell.train.common.self_data import add_self_data_parser, cmd_self_data
from foretell.train.corpus import add_corpus_parser

KINDS = {"adaspec": "foretell.train.adaspec.commands", "parallel-head": "foretell.train.parallel_head.commands",
         "hidden-state": "foretell.train.hidden_state.commands", "eagle3": "foretell.train.eagle3.commands"}


def add_training_parsers(sub) -> None:
    t = sub.add_parser(
        "train", help=f"train a drafter for a target: {', '.join(KINDS)}",
        description=f"Train a drafter for a target. Kinds: {', '.join(KINDS)}. Every kind takes the same options "
        "(target, data, evaluation, schedule, run folder), then its own; see foretell train KIND --help.",
    )
    kinds = t.add_subparsers(dest="train_command", required=True, metavar="KIND")
    for name, module_name in KINDS.items():
        kind = import_module(module_name)
        p = kinds.add_parser(name, help=kind.HELP, description=kind.DESCRIPTION)
        kind.add_arguments(p)
        p.set_defaults(run=kind.run)
    add_eval_draft_parser(sub)
    add_self_data_parser(sub)
    add_corpus_parser(sub)
    sub.choices["eval-draft"].set_defaults(run=cmd_eval_draft)
    sub.choices["self-data"].set_defaults(run=cmd_self_data)
