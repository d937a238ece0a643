"""`foretell distill` and `foretell eval-draft`: argument parsing and the two command functions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from foretell.errors import ForetellError


def add_distill_parser(sub) -> None:
    from foretell.train.data import DataConfig
    from foretell.train.pipeline import DRAFT_INITS, STAGES, DistillConfig, DraftSpec
    from foretell.train.teacher import TeacherConfig
    from foretell.train.trainer import TrainConfig

    d = sub.add_parser(
        "distill", help="train a draft model for a target: AdaSPEC selective distillation (and baselines)",
        description="Stages: finetune (optional, --finetune) -> teacher top-k cache -> reference (KL on all tokens) -> "
        "draft (AdaSPEC: KL on the top --select-fraction tokens by KL(p||q_draft) - KL(p||q_ref)); "
        "distill-all-tokens is the plain-distillation baseline. Each stage writes OUT/<stage>/model, "
        "checkpoints, and is skipped once complete; rerunning the same command resumes.",
    )
    t, data, draft, teacher = TrainConfig(), DataConfig(), DraftSpec(), TeacherConfig()
    d.add_argument("--target", default="smollm2-135m", help="target model: preset, .gguf or HF folder (default: %(default)s)")
    d.add_argument("--stage", default="all", choices=STAGES, help="what to run (default: %(default)s)")
    d.add_argument("--data", default=data.source, help="gsm8k | sharegpt | a .jsonl file of {question, answer} or {messages}")
    d.add_argument("--num-sequences", type=int, help="training sequences to build (default: all the data gives)")
    d.add_argument("--seq-len", type=int, default=data.seq_len, help="tokens per training sequence (default: %(default)s)")
    d.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                   help="pack conversations back to back (default: on for sharegpt, off otherwise)")
    d.add_argument("--draft-layers", type=int, default=draft.layers, help="decoder layers of the draft (default: %(default)s)")
    d.add_argument("--draft-init", default=draft.init,
                   help=f"{' | '.join(DRAFT_INITS)} | a draft model folder: truncate = the target's first layers, "
                   "random = fresh layers, a folder = start from that (already trained) draft (default: %(default)s)")
    d.add_argument("--draft-hidden", type=int, help="hidden size of a random-init draft (default: the target's)")
    d.add_argument("--steps", type=int, default=t.steps, help="optimizer steps per stage (default: %(default)s)")
    d.add_argument("--batch-size", type=int, default=t.batch_size, help="sequences per step, all processes (default: %(default)s)")
    d.add_argument("--micro-batch-size", type=int, default=t.micro_batch_size, help="sequences per forward (default: %(default)s)")
    d.add_argument("--adaspec-batch-size", type=int,
                   help="sequences per step of the AdaSPEC stage (default: --batch-size); the authors' configs use "
                   "--batch-size / k at the same --steps, so a selective step trains on as many tokens as a plain one")
    d.add_argument("--lr", type=float, default=t.lr, help="peak learning rate (default: %(default)s)")
    d.add_argument("--warmup", type=int, help="warmup steps (default: 10%% of --steps)")
    d.add_argument("--bf16", action="store_true", help="bfloat16 autocast for matmuls (weights stay float32)")
    d.add_argument("--checkpoint-every", type=int, default=t.checkpoint_every, help="steps between checkpoints (default: %(default)s)")
    d.add_argument("--seed", type=int, default=t.seed)
    d.add_argument("--select-fraction", type=float, default=DistillConfig.select_fraction,
                   help="AdaSPEC's k: fraction of tokens the draft trains on (default: %(default)s)")
    d.add_argument("--draft-name", default=DistillConfig.draft_name,
                   help="folder in OUT of the AdaSPEC draft; a sweep over --select-fraction runs --stage draft once "
                   "per k with its own name and shares the reference (default: %(default)s)")
    d.add_argument("--topk-teacher", type=int, default=teacher.top_k, help="target log-probs cached per token (default: %(default)s)")
    d.add_argument("--teacher-dtype", default=teacher.dtype, choices=("float32", "bfloat16"),
                   help="dtype of the target's pass that fills the teacher cache (default: %(default)s)")
    d.add_argument("--finetune", action="store_true", help=f"stage (a): fine-tune the target on the data first (lr {DistillConfig.finetune_lr}; "
                   "pass it on every command of the run: the later stages then distil the fine-tuned target)")
    d.add_argument("--out", required=True, help="run folder; the same folder again resumes")
    d.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from checkpoints and skip finished stages (default: on); --no-resume redoes the stage")
    d.add_argument("--processes", type=int, default=1, help="data-parallel processes (gloo) (default: %(default)s)")
    d.add_argument("--eval-sequences", type=int, default=DistillConfig.eval_sequences,
                   help="stage all: held-out sequences for the alpha table in OUT/report.md (0 = skip) (default: %(default)s)")
    d.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def add_eval_draft_parser(sub) -> None:
    from foretell.train.evaluate import EvalOptions

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
    e.add_argument("--temperature", type=float, default=o.temperature, help="(default: %(default)s)")
    e.add_argument("--seed", type=int, default=o.seed)
    e.add_argument("--dtype", default=o.dtype, choices=("float32", "bfloat16", "float16"))
    e.add_argument("--json", help="also write the rows to this JSON file")
    e.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def _positive(**values) -> None:
    for name, v in values.items():
        if v is not None and v < 1:
            raise ForetellError(f"--{name.replace('_', '-')} must be >= 1, got {v}")


def distill_config(args):
    from foretell.train.data import DataConfig
    from foretell.train.pipeline import DistillConfig, DraftSpec
    from foretell.train.teacher import TeacherConfig
    from foretell.train.trainer import TrainConfig

    _positive(steps=args.steps, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, seq_len=args.seq_len,
              draft_layers=args.draft_layers, topk_teacher=args.topk_teacher, processes=args.processes,
              num_sequences=args.num_sequences, checkpoint_every=args.checkpoint_every,
              adaspec_batch_size=args.adaspec_batch_size)
    train = TrainConfig(steps=args.steps, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, lr=args.lr,
                        warmup_steps=args.warmup, bf16=args.bf16, checkpoint_every=args.checkpoint_every, seed=args.seed)
    return DistillConfig(
        target=args.target, out=Path(args.out),
        data=DataConfig(args.data, "train", args.num_sequences, args.seq_len, args.pack),
        draft=DraftSpec(args.draft_layers, args.draft_init, args.draft_hidden, args.seed),
        train=train, teacher=TeacherConfig(top_k=args.topk_teacher, dtype=args.teacher_dtype), select_fraction=args.select_fraction,
        finetune=args.finetune, processes=args.processes, resume=args.resume, eval_sequences=args.eval_sequences,
        draft_name=args.draft_name, adaspec_batch_size=args.adaspec_batch_size,
    )


def cmd_distill(args) -> None:
    import torch

    from foretell.train.evaluate import EvalOptions, compare_drafts, format_table
    from foretell.train.pipeline import run_pipeline

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = distill_config(args)
    models = run_pipeline(cfg, args.stage)
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


def cmd_eval_draft(args) -> None:
    import torch

    from foretell.train.evaluate import EvalOptions, compare_drafts, format_table

    if args.threads:
        torch.set_num_threads(args.threads)
    _positive(num_sequences=args.num_sequences, seq_len=args.seq_len, gamma=args.gamma, max_new_tokens=args.max_new_tokens)
    if args.temperature <= 0:
        raise ForetellError("--temperature must be > 0: alpha compares sampling distributions")
    opts = EvalOptions(args.num_sequences, args.seq_len, args.prompts, args.max_new_tokens, args.gamma,
                       args.temperature, args.seed, args.dtype,
                       prompt_source=None if args.prompts_from == "data" else args.prompts_from)
    rows = compare_drafts(args.target, parse_drafts(args.draft), args.data, opts)
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
        print(f"rows: {args.json}", file=sys.stderr)
