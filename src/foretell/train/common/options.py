"""The options of `foretell train KIND`, defined once: every kind has the same command shape.

add_run_arguments: target, data, evaluation, schedule and run folder, shared by every kind (each
passes its own defaults). add_feature_kind_arguments: those, the target's feature pass and data-parallel
training, for the kinds that train on cached features (parallel-head, hidden-state, eagle3). A kind's own
options come after these.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
import os
import sys

import torch

from foretell.errors import ForetellError
from foretell.runtime import wide_linear
from foretell.train.common.data import DataConfig, check_sources
from foretell.train.common.distributed import call_with_context, from_environment, launch
from foretell.train.common.features import FeatureConfig


def check_positive(**values) -> None:
    for name, v in values.items():
        if v is not None and v < 1:
            raise ForetellError(f"--{name.replace('_', '-')} must be >= 1, got {v}")


def add_run_arguments(p, train, eval_sequences: int, *, report: str = "OUT/eval.json", eval_data: bool = True,
                      both: bool = True, no_resume: str = "starts over in OUT: retrains, and remakes the data and "
                      "the feature cache where their settings changed") -> None:
    """The options every kind shares. `train` (a TrainConfig) and `eval_sequences` are the kind's defaults;
    `report` is where its held-out evaluation goes, `eval_data` whether it takes other held-out data than
    --data's test split, `both` whether --data takes both, `no_resume` what --no-resume does."""
    data = DataConfig()
    g = p.add_argument_group("options of every training kind")
    g.add_argument("--target", default="smollm2-135m", help="target model: preset, .gguf or HF folder (default: %(default)s)")
    sources = "gsm8k | sharegpt | both (half each)" if both else "gsm8k | sharegpt"
    g.add_argument("--data", default=data.source,
                   help=f"{sources} | a .jsonl file of {{question, answer}} or {{messages}} (default: %(default)s)")
    g.add_argument("--num-sequences", type=int, help="training sequences to build (default: all the data gives)")
    g.add_argument("--seq-len", type=int, default=data.seq_len, help="tokens per training sequence (default: %(default)s)")
    g.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                   help="pack conversations back to back (default: on for sharegpt, off otherwise)")
    if eval_data:
        g.add_argument("--eval-data", help=f"held-out data for {report}: gsm8k | sharegpt | both (test splits) "
                       "| a .jsonl file (default: the test split of --data)")
    g.add_argument("--eval-sequences", type=int, default=eval_sequences,
                   help=f"held-out sequences for {report}, 0 = skip (default: %(default)s)")
    g.add_argument("--steps", type=int, default=train.steps,
                   help="optimizer steps of each model trained (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=train.batch_size,
                   help="sequences per optimizer step (default: %(default)s)")
    g.add_argument("--lr", type=float, default=train.lr, help="peak learning rate (default: %(default)s)")
    g.add_argument("--warmup", type=int, help="warmup steps (default: 10%% of --steps)")
    g.add_argument("--bf16", action="store_true",
                   help="bfloat16 autocast for the trained model's matmuls (weights stay float32)")
    g.add_argument("--checkpoint-every", type=int, default=train.checkpoint_every,
                   help="steps between checkpoints (default: %(default)s)")
    g.add_argument("--seed", type=int, default=train.seed,
                   help="seed of the init, the data order and any sampling (default: %(default)s)")
    g.add_argument("--out", required=True, help="run folder; the same folder again resumes")
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help=f"continue from checkpoints and skip finished parts (default: on); --no-resume {no_resume}")
    g.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def add_option_table(g, rows) -> None:
    """A kind's own options as rows (flag, type, default, help), each help ending with its default."""
    for flag, kind, default, text in rows:
        g.add_argument(flag, type=kind, default=default, help=f"{text} (default: %(default)s)")


def add_topk_argument(g, top_k: int) -> None:
    g.add_argument("--topk-teacher", type=int, default=top_k, help="target log-probs cached per token (default: %(default)s)")


def add_feature_arguments(p) -> None:
    """The target's feature pass (common/features.py) of the kinds that train on cached features."""
    feats = FeatureConfig()
    g = p.add_argument_group("the target's feature pass")
    add_topk_argument(g, feats.top_k)
    g.add_argument("--feature-dtype", default=feats.dtype, choices=("float32", "bfloat16"),
                   help="dtype of the target's feature pass (default: %(default)s)")
    g.add_argument("--feature-batch", type=int, default=feats.batch_size,
                   help="sequences per target forward in the feature pass (default: %(default)s)")
    g.add_argument("--features-from", metavar="RUN",
                   help="read the data and feature cache of the finished run folder RUN (another parallel-head, eagle3 "
                   "or hidden-state run of this target) instead of making them: no feature pass. The data options, "
                   "--topk-teacher, --feature-dtype and the layers must be those RUN used; the layers default to "
                   "RUN's")


def add_distributed_arguments(p) -> None:
    """Where the kinds trained on cached features run, and on how many processes (common/distributed.py).
    Under torchrun every process reads its rank from the environment and --processes is not needed."""
    g = p.add_argument_group("data-parallel training (also: torchrun --nproc-per-node N -m foretell.cli train ...)")
    g.add_argument("--processes", type=int, default=1,
                   help="CPU processes on this machine (gloo), splitting --batch-size between them (default: %(default)s)")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu, or cuda: each process on GPU LOCAL_RANK, NCCL between them (default: %(default)s)")


def add_feature_kind_arguments(p, train, eval_sequences: int, title: str):
    """The options of a kind trained on cached features that come before its own: the shared ones (`train`
    and `eval_sequences` its defaults), the feature pass and data-parallel training. Returns the group
    `title` for the kind's own."""
    add_run_arguments(p, train, eval_sequences)
    add_feature_arguments(p)
    add_distributed_arguments(p)
    return p.add_argument_group(title)


def add_head_arguments(g, anchors: int) -> None:
    """Own options the heads trained at sampled anchors (parallel head, EAGLE-3) share, meaning the same."""
    g.add_argument("--anchors", type=int, default=anchors, help="anchors sampled per sequence per step (default: %(default)s)")
    g.add_argument("--init-head", help="start from this trained head (a saved OUT/head of the same shape) instead of "
                   "a new one: train longer with a fresh schedule")


def run_feature_kind(fn, cfg, args) -> bool:
    """run_distributed with --threads applied first; True on the main (or launching) process."""
    if args.threads:
        torch.set_num_threads(args.threads)
    warn_emulated_bf16(args)
    return run_distributed(fn, cfg, args)


def warn_emulated_bf16(args) -> None:
    """--bf16 on a CPU whose bf16 matmul is emulated (no AVX512-BF16 / AMX) makes every training step many times
    slower than fp32 (runtime/wide_linear.py): say so at the start. --feature-dtype bfloat16 is fine there: the
    feature pass runs its wide products in fp32 (feature_run.prepare_features) and only stores bf16."""
    if not getattr(args, "bf16", False) or getattr(args, "device", "cpu") != "cpu":
        return

    rows = wide_linear.fp32_wide_rows(torch.get_num_threads())  # read at call time (tests stand in for the CPU)
    if rows is not None:
        print(f"foretell train: warning: this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native bf16 "
              f"matrix multiply: products of {rows} rows or more run faster in fp32 here, and --bf16 can make every "
              "training step several times slower; drop it to train in fp32", file=sys.stderr)


def run_distributed(fn, cfg, args) -> bool:
    """fn(cfg, ctx=...) on --processes spawned processes, or on this process in the torchrun group the
    environment describes (a single process without one). True on the main (or launching) process."""
    check_positive(processes=args.processes)
    if args.processes > 1:
        if args.device != "cpu" or int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ForetellError("--processes spawns CPU processes on this machine; for GPUs or several machines "
                                "start the command with torchrun instead (docs/training.md)")
        cfg.train.micro_batches(args.processes)  # a bad split fails before any process starts
        launch(call_with_context, (fn, cfg), args.processes, args.threads)
        return True
    ctx = from_environment(args.device)
    fn(cfg, ctx=ctx)
    return ctx.is_main


def data_config(args):
    """The training data the shared options name (a DataConfig)."""
    return DataConfig(args.data, "train", args.num_sequences, args.seq_len, args.pack)


def train_config(args, train):
    """`train` (the kind's TrainConfig) with the shared schedule options applied."""
    return replace(train, steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup,
                   bf16=args.bf16, checkpoint_every=args.checkpoint_every, seed=args.seed)


def check_run_options(args) -> None:
    """The shared options every training kind takes, checked the same way for all of them."""
    check_positive(num_sequences=args.num_sequences, seq_len=args.seq_len, steps=args.steps,
                   batch_size=args.batch_size, checkpoint_every=args.checkpoint_every, threads=args.threads)
    if args.eval_sequences < 0:
        raise ForetellError(f"--eval-sequences must be >= 0, got {args.eval_sequences}")
    if not args.lr > 0:
        raise ForetellError(f"--lr must be > 0, got {args.lr}")
    if args.warmup is not None and args.warmup < 0:
        raise ForetellError(f"--warmup must be >= 0, got {args.warmup}")


def check_data_options(args) -> None:
    """--data and --eval-data name sources that can be read, checked before the target loads or anything is
    written (a missing held-out file would otherwise show only after the data step), and after the options
    themselves: a wrong option is named whether or not the data is on this machine."""
    held_out = getattr(args, "eval_data", None)
    evaluated = hasattr(args, "eval_data") and args.eval_sequences > 0
    check_sources(args.data, "--data", ("train", "test") if evaluated and held_out is None else ("train",))
    if held_out is not None and evaluated:
        check_sources(held_out, "--eval-data", ("test",))


def run_settings(args, train) -> dict:
    """Check the shared and feature-pass options of a kind trained on cached features; returns the fields
    of its run config they set (common/feature_run.py's FeatureRunConfig; `train`: the kind's defaults)."""
    check_run_options(args)
    check_positive(topk_teacher=args.topk_teacher, feature_batch=args.feature_batch)
    if args.seq_len < 3:
        raise ForetellError(f"--seq-len must be >= 3 (an anchor needs two tokens after it), got {args.seq_len}")
    features = FeatureConfig(args.topk_teacher, args.feature_batch, args.feature_dtype)
    settings = dict(target=args.target, out=Path(args.out), data=data_config(args), eval_data=args.eval_data,
                    eval_sequences=args.eval_sequences, features=features, train=train_config(args, train),
                    resume=args.resume, features_from=Path(args.features_from) if args.features_from else None)
    check_data_options(args)
    return settings
