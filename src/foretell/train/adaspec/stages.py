"""One training stage as a self-contained, picklable job: what to start from, which loss, where to write.

Each process of a distributed run rebuilds everything from the files a job names, so nothing
but paths and settings cross process boundaries.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from foretell.models.derive import save_model_folder
from foretell.runtime.loading import build_model, load_tokenizer
from foretell.train.adaspec.losses import adaspec_loss, distill_loss, lm_loss
from foretell.train.adaspec.teacher import TeacherCache
from foretell.train.common.data import TokenData
from foretell.train.common.distributed import DistContext
from foretell.train.common.run_folder import DONE, open_job_folder
from foretell.train.common.trainer import TrainConfig, train

KINDS = ("finetune", "distill", "adaspec")  # cross-entropy on data; KL on all tokens; selective KL
MODEL_DIR = "model"


@dataclass(frozen=True)
class StageJob:
    kind: str
    init: Path  # model folder the stage starts from
    out: Path  # stage folder: checkpoint, log, loss curve, model/ and done.json
    data_file: Path
    train: TrainConfig
    teacher_dir: Path | None = None  # distill, adaspec
    ref_kl_file: Path | None = None  # adaspec
    select_fraction: float = 0.4
    init_sha256: str = ""  # of init's weights: a stage folder is only resumed from the same start
    resume: bool = True
    stop_after: int | None = None  # stop early (tests of resuming)

    def fingerprint(self) -> dict:
        d = asdict(self)
        for k in ("resume", "stop_after", "out"):
            d.pop(k)
        return json.loads(json.dumps(d, default=str))


def begin_stage(job: StageJob) -> bool:
    """Ready the stage folder (common/run_folder.py refuses one made with other settings; --no-resume
    clears it); True if the stage already finished."""
    open_job_folder(job)
    return (job.out / DONE).is_file() and (job.out / MODEL_DIR / "config.json").is_file()


def make_batch_fn(job: StageJob, data: TokenData):
    """indices -> the tensors the stage's loss reads."""
    cache = TeacherCache.open(job.teacher_dir) if job.teacher_dir else None
    ref_kl = load_file(str(job.ref_kl_file))["kl"] if job.ref_kl_file else None

    def batch_fn(index: torch.Tensor) -> dict:
        batch = {"input_ids": data.input_ids[index], "valid": data.loss_mask[index]}
        if cache is not None:
            batch["teacher_logp"], batch["teacher_ids"] = cache.rows(index)
        if ref_kl is not None:
            batch["ref_kl"] = ref_kl[index]
        return batch

    return batch_fn


def make_objective(job: StageJob):
    if job.kind == "finetune":
        return lambda logits, b: lm_loss(logits, b["input_ids"], b["valid"])
    if job.kind == "distill":
        return lambda logits, b: distill_loss(logits, b["teacher_logp"], b["teacher_ids"], b["valid"])
    if job.kind == "adaspec":
        return lambda logits, b: adaspec_loss(
            logits, b["teacher_logp"], b["teacher_ids"], b["ref_kl"], b["valid"], job.select_fraction
        )
    raise ValueError(f"unknown stage kind {job.kind!r}; use one of {KINDS}")


def run_stage(ctx: DistContext, job: StageJob) -> None:
    """Train from job.init (resuming from the stage's checkpoint) and save the model folder when done."""
    model = build_model(job.init, torch.float32)
    data = TokenData.load(job.data_file)
    steps = train(model, make_objective(job), make_batch_fn(job, data), len(data), job.train, job.out, ctx,
                  resume=job.resume, stop_after=job.stop_after, desc=f"{job.out.name} ({job.kind})")
    if ctx.is_main and steps == job.train.steps:
        save_model_folder(model, load_tokenizer(job.init), job.out / MODEL_DIR, extra={"stage": job.out.name, **job.fingerprint()})
        (job.out / DONE).write_text(json.dumps({"steps": steps}))
    ctx.barrier()
