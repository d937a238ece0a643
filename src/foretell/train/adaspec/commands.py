"""`foretell train adaspec` and `foretell eval-draft`: their own options and the two command functions.

The options `train adaspec` shares with every training kind come from common/options.py, with AdaSPEC's defaults.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from foretell.errors import ForetellError
from foretell.models.module_folder import run_folder_of, saved_kind
from foretell.train.adaspec.evaluate import EvalOptions, compare_drafts, format_table
from foretell.train.adaspec.pipeline import DRAFT_INITS, STAGES, DistillConfig, DraftSpec, run_pipeline
from foretell.train.adaspec.teacher import TeacherConfig
from foretell.train.common.distributed import from_environment
from foretell.train.common.options import (
    add_run_arguments, add_topk_argument, check_data_options, check_positive, check_run_options, data_config,
    train_config,
)
from foretell.train.common.trainer import TrainConfig


HELP = "a draft model: AdaSPEC selective distillation (and its baselines)"
DESCRIPTION = (
    "Stages: finetune (optional, --finetune) -> teacher top-k cache -> reference (KL on all tokens) -> "
    "draft (AdaSPEC: KL on the top --select-fraction tokens by KL(p||q_draft) - KL(p||q_ref)); "
    "distill-all-tokens is the plain-distillation baseline. Each stage writes OUT/<stage>/model, "
    "checkpoints, and is skipped once complete; rerunning the same command resumes."
)


def add_arguments(p) -> None:
    """This kind's options, after the shared ones (common/options.py)."""
    t, draft, teacher = TrainConfig(), DraftSpec(), TeacherConfig()
    add_run_arguments(p, t, DistillConfig.eval_sequences, report="the alpha table in OUT/report.md (stage all)",
                      eval_data=False, both=False, no_resume="redoes the stage asked for (not its prerequisites)")
    g = p.add_argument_group("adaspec options")
    g.add_argument("--stage", default="all", choices=STAGES, help="what to run (default: %(default)s)")
    g.add_argument("--draft-layers", type=int, default=draft.layers, help="decoder layers of the draft (default: %(default)s)")
    g.add_argument("--draft-init", default=draft.init,
                   help=f"{' | '.join(DRAFT_INITS)} | a draft model folder: truncate = the target's first layers, "
                   "random = fresh layers, a folder = start from that (already trained) draft (default: %(default)s)")
    g.add_argument("--draft-hidden", type=int, help="hidden size of a random-init draft (default: the target's)")
    g.add_argument("--micro-batch-size", type=int, default=t.micro_batch_size, help="sequences per forward (default: %(default)s)")
    g.add_argument("--adaspec-batch-size", type=int,
                   help="sequences per step of the AdaSPEC stage (default: --batch-size); the authors' configs use "
                   "--batch-size / k at the same --steps, so a selective step trains on as many tokens as a plain one")
    g.add_argument("--select-fraction", type=float, default=DistillConfig.select_fraction,
                   help="AdaSPEC's k: fraction of tokens the draft trains on (default: %(default)s)")
    g.add_argument("--draft-name", default=DistillConfig.draft_name,
                   help="folder in OUT of the AdaSPEC draft; a sweep over --select-fraction runs --stage draft once "
                   "per k with its own name and shares the reference (default: %(default)s)")
    add_topk_argument(g, teacher.top_k)
    g.add_argument("--teacher-dtype", default=teacher.dtype, choices=("float32", "bfloat16"),
                   help="dtype of the target's pass that fills the teacher cache (default: %(default)s)")
    g.add_argument("--finetune", action="store_true", help=f"stage (a): fine-tune the target on the data first (lr {DistillConfig.finetune_lr}; "
                   "pass it on every command of the run: the later stages then distil the fine-tuned target)")
    g.add_argument("--processes", type=int, default=1, help="data-parallel processes (gloo), splitting --batch-size between them (default: %(default)s)")


def add_eval_draft_parser(sub) -> None:
    o = EvalOptions()
    e = sub.add_parser(
        "eval-draft", help="token acceptance rate alpha of draft models on held-out data, and real speculative decoding",
        description="alpha = mean over held-out assistant tokens of sum_v min(p(v), q(v)) (target p, draft q, "
        "teacher-forced); then acceptance rate, tau and speedup of draft-model speculative decoding on a few prompts.",
    )
    e.add_argument("--target", default="smollm2-135m", help="target model (default: %(default)s)")
    e.add_argument("--draft", action="append", required=True, help="draft model folder, or NAME=FOLDER (repeatable)")
    e.add_argument("--data", default="gsm8k", help="held-out data: gsm8k | sharegpt (test splits) | a .jsonl file")
    e.add_argument("--num-sequences", type=int, default=o.num_sequences, help="sequences for alpha (default: %(default)s)")
    e.add_argument("--seq-len", type=int, default=o.seq_len, help="(default: %(default)s)")
    e.add_argument("--prompts", type=int, default=o.prompts, help="prompts to decode for real, 0 = none (default: %(default)s)")
    e.add_argument("--prompts-from", choices=("data", "spec-bench"), default="data",
                   help="decode held-out prompts of --data, or Spec-Bench first turns spread over its 6 categories "
                   "(default: %(default)s)")
    e.add_argument("--max-new-tokens", type=int, default=o.max_new_tokens, help="(default: %(default)s)")
    e.add_argument("--gamma", type=int, default=o.gamma, help="draft tokens per step (default: %(default)s)")
    e.add_argument("--temperature", type=float, default=o.temperature,
                   help="alpha's temperature, > 0 (default: %(default)s); also the decoding's unless --decode-temperature")
    e.add_argument("--decode-temperature", type=float,
                   help="temperature of the real speculative decoding, 0 = greedy (default: --temperature)")
    e.add_argument("--seed", type=int, default=o.seed)
    e.add_argument("--dtype", default=o.dtype, choices=("float32", "bfloat16", "float16"))
    e.add_argument("--json", help="also write the rows to this JSON file")
    e.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def adaspec_config(args):
    check_run_options(args)
    check_positive(micro_batch_size=args.micro_batch_size, draft_layers=args.draft_layers, topk_teacher=args.topk_teacher,
                   processes=args.processes, adaspec_batch_size=args.adaspec_batch_size)
    train = train_config(args, TrainConfig(micro_batch_size=args.micro_batch_size))
    train.micro_batches(args.processes)  # the batch's shape with the other options, before the data's files
    check_data_options(args)
    return DistillConfig(
        target=args.target, out=Path(args.out), data=data_config(args),
        draft=DraftSpec(args.draft_layers, args.draft_init, args.draft_hidden, args.seed),
        train=train, teacher=TeacherConfig(top_k=args.topk_teacher, dtype=args.teacher_dtype), select_fraction=args.select_fraction,
        finetune=args.finetune, processes=args.processes, resume=args.resume, eval_sequences=args.eval_sequences,
        draft_name=args.draft_name, adaspec_batch_size=args.adaspec_batch_size,
    )


def run(args) -> None:
    cfg = adaspec_config(args)  # checks the options first, --threads included
    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = from_environment()  # under torchrun: this process's rank (gloo; adaspec trains on CPU)
    if ctx.active and cfg.processes > 1:
        raise ForetellError("--processes spawns processes on this machine; under torchrun leave it out")
    models = run_pipeline(cfg, args.stage, ctx)
    if not ctx.is_main:
        return
    for name, path in models.items():
        print(f"{name}: {path}")
    if args.stage == "all" and cfg.eval_sequences > 0:
        drafts = {"undistilled": models["init"], "distill-all-tokens": models["distill-all-tokens"], "adaspec": models["draft"]}
        target = models.get("finetune", cfg.target)
        opts = EvalOptions(num_sequences=cfg.eval_sequences, seq_len=cfg.data.seq_len, prompts=0)
        rows = compare_drafts(target, drafts, cfg.data.source, opts)
        table = format_table(rows)
        (cfg.out / "report.md").write_text(f"# Draft acceptance on held-out {cfg.data.source}\n\n{table}\n")
        (cfg.out / "report.json").write_text(json.dumps(rows, indent=2))
        print(table)


def parse_drafts(specs: list[str]) -> dict[str, Path]:
    """FOLDER or NAME=FOLDER; a stage's OUT/<stage>/model is named after the stage."""
    drafts = {}
    for spec in specs:
        name, path = spec.split("=", 1) if "=" in spec else ("", spec)
        if not path:
            raise ForetellError(f"--draft {spec!r}: give FOLDER or NAME=FOLDER")
        p = Path(path)
        drafts[name or (p.parent.name if p.name == "model" else p.name)] = p
    return drafts


def refuse_a_trained_head(path: Path) -> None:
    """eval-draft measures draft models; a head (or hidden-state draft) folder would fail deep in loading a
    tokenizer. Say what the folder is, where its own figures are, and how to decode with it."""
    found = saved_kind(path)
    if found is None:
        return
    kind, where = found
    report = run_folder_of(where, kind) / "eval.json"
    figures = (f"Its held-out acceptance is in {report}" if report.is_file() else
               f"Its held-out acceptance goes to {report} when its `foretell train {kind.method}` run finishes "
               "(with --eval-sequences above 0)")
    raise ForetellError(f"--draft {path} holds a {kind.what} ({where / kind.config_file}), not a draft model: "
                        "eval-draft measures draft models (Hugging Face folders, e.g. an adaspec run's "
                        f"OUT/draft/model). {figures}; to decode with it: foretell generate --drafter {kind.method} "
                        f"{kind.flag} {path}")


def cmd_eval_draft(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    check_positive(num_sequences=args.num_sequences, seq_len=args.seq_len, gamma=args.gamma, max_new_tokens=args.max_new_tokens)
    if args.temperature <= 0:
        raise ForetellError("--temperature must be > 0: alpha compares sampling distributions (greedy decoding: "
                            "--decode-temperature 0)")
    if args.decode_temperature is not None and args.decode_temperature < 0:
        raise ForetellError(f"--decode-temperature must be >= 0 (0 = greedy), got {args.decode_temperature}")
    opts = EvalOptions(args.num_sequences, args.seq_len, args.prompts, args.max_new_tokens, args.gamma,
                       args.temperature, args.seed, args.dtype,
                       prompt_source=None if args.prompts_from == "data" else args.prompts_from,
                       decode_temperature=args.decode_temperature)
    drafts = parse_drafts(args.draft)
    for path in drafts.values():
        refuse_a_trained_head(path)
    rows = compare_drafts(args.target, drafts, args.data, opts)
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
        print(f"rows: {args.json}", file=sys.stderr)
