"""The AdaSPEC pipeline (arXiv 2510.19779): fine-tune p, distil a reference, train the draft selectively.

  (a) finetune            optional: the target p trained on the task data (cross-entropy)
      teacher cache       p's top-k log-probs over the training sequences, computed once
      init                the undistilled draft (a truncated copy of p, or random layers)
  (b) reference           init distilled from p with KL on every token
  (c) draft               init trained with KL on the tokens where KL(p||q_draft) - KL(p||q_ref)
                          is largest (AdaSPEC's filter)
      distill-all-tokens  the baseline (DistillSpec-style distillation): the same training as the
                          reference, so with equal settings it is the reference model itself

Every stage writes OUT/<stage>/model (a Hugging Face folder), resumes from its checkpoint and is
skipped once complete.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from foretell.build import check_same_tokenizer
from foretell.errors import ForetellError
from foretell.models.derive import DraftShape, draft_from_config, save_model_folder, truncated_copy
from foretell.runtime.loading import build_model, load_tokenizer, parse_dtype, resolve_model_dir
from foretell.train.adaspec.stages import MODEL_DIR, StageJob, begin_stage, run_stage
from foretell.train.adaspec.teacher import TeacherCache, TeacherConfig, build_teacher_cache, per_token_kl
from foretell.train.common.cache import fingerprint_of, read_meta
from foretell.train.common.data import DataConfig, TokenData, build_token_data
from foretell.train.common.distributed import DistContext, launch
from foretell.train.common.run_folder import DONE
from foretell.train.common.trainer import TrainConfig

STAGES = ("all", "finetune", "reference", "draft", "distill-all-tokens")
DRAFT_INITS = ("truncate", "random")


@dataclass(frozen=True)
class DraftSpec:
    layers: int = 2
    init: str = "truncate"  # truncate: the target's first layers; random: fresh layers (embeddings copied)
    hidden_size: int | None = None  # random init only; None = the target's
    seed: int = 0


@dataclass(frozen=True)
class DistillConfig:
    target: str
    out: Path
    data: DataConfig = field(default_factory=DataConfig)
    draft: DraftSpec = field(default_factory=DraftSpec)
    train: TrainConfig = field(default_factory=TrainConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    select_fraction: float = 0.4  # AdaSPEC's k
    finetune: bool = False  # stage (a); `all` runs it only when asked
    finetune_lr: float = 2e-5  # a pretrained target needs a far smaller step than a draft
    processes: int = 1
    resume: bool = True
    eval_sequences: int = 64  # held-out sequences for the report's acceptance rate (stage all)
    draft_name: str = "draft"  # OUT/<name> of the AdaSPEC stage: a --select-fraction sweep keeps one per k
    # Sequences per step of the AdaSPEC stage (None = train.batch_size). The authors' released configs give the
    # selective stage 1/k times the reference's batch at the same number of steps (2 -> 5 at k = 0.4), so each
    # step trains on as many tokens as a plain-distillation step.
    adaspec_batch_size: int | None = None

    def adaspec_train(self) -> TrainConfig:
        if self.adaspec_batch_size is None:
            return self.train
        return replace(self.train, batch_size=self.adaspec_batch_size)


def prepare_data(cfg: DistillConfig, tokenizer) -> Path:
    path = cfg.out / "data" / "train.safetensors"
    settings = cfg.out / "data" / "data.json"
    want = json.dumps(asdict(cfg.data), sort_keys=True)
    if path.is_file() and settings.is_file() and settings.read_text() == want:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    data = build_token_data(cfg.data, tokenizer)
    data.save(path)
    settings.write_text(want)
    print(f"foretell train adaspec: {len(data)} sequences of {cfg.data.seq_len} tokens, "
          f"{int(data.loss_mask.sum())} trained positions -> {path}")
    return path


def make_init(cfg: DistillConfig, target_dir: Path, tokenizer) -> Path:
    """The undistilled draft, saved once so the reference and the draft start from the same weights."""
    out = cfg.out / "init" / MODEL_DIR
    marker = cfg.out / "init" / "draft.json"
    want = json.dumps(asdict(cfg.draft), sort_keys=True)
    if (out / "config.json").is_file() and marker.is_file():
        if marker.read_text() != want and cfg.resume:
            raise ForetellError(f"{out} is a draft of another shape; use another --out or --no-resume")
        check_same_tokenizer(tokenizer, load_tokenizer(out), str(target_dir), str(out))
        if marker.read_text() == want:
            return out
    if cfg.draft.init not in DRAFT_INITS:
        return copy_trained_init(cfg, target_dir, tokenizer, out, marker, want)
    target = build_model(target_dir, torch.float32)
    try:
        if cfg.draft.init == "truncate":
            draft = truncated_copy(target, cfg.draft.layers)
        else:
            shape = DraftShape(cfg.draft.layers, hidden_size=cfg.draft.hidden_size)
            draft = draft_from_config(target, shape, seed=cfg.draft.seed)
    except ValueError as e:
        raise ForetellError(f"cannot make the draft: {e}") from None
    save_model_folder(draft, tokenizer, out, extra={"stage": "init", **asdict(cfg.draft)})
    marker.write_text(want)
    return out


def copy_trained_init(cfg: DistillConfig, target_dir: Path, tokenizer, out: Path, marker: Path, want: str) -> Path:
    """--draft-init FOLDER: start from a draft that already works (the paper's drafts are pretrained LMs),
    e.g. one distilled on other data. Its own shape wins over --draft-layers."""
    source = Path(cfg.draft.init)
    if not (source / "config.json").is_file():
        raise ForetellError(f"--draft-init {cfg.draft.init!r} is neither {' nor '.join(DRAFT_INITS)} nor a draft model "
                            "folder (config.json and weights, e.g. OUT/reference/model of an earlier run)")
    check_same_tokenizer(tokenizer, load_tokenizer(source), str(target_dir), str(source))
    draft = build_model(source, torch.float32)
    save_model_folder(draft, tokenizer, out, extra={"stage": "init", "from": str(source.resolve())})
    marker.write_text(want)
    return out


def prepare_teacher(cfg: DistillConfig, teacher_dir: Path, data_file: Path) -> Path:
    folder = cfg.out / "teacher"
    fingerprint = {"target": fingerprint_of(teacher_dir), "data": asdict(cfg.data), "dtype": cfg.teacher.dtype}
    meta = read_meta(folder)
    if meta is not None and meta.get("fingerprint") != json.loads(json.dumps(fingerprint)) and not cfg.resume:
        shutil.rmtree(folder)  # made from another target or data: --no-resume rebuilds it
        meta = None
    if meta is not None and meta["done"] == meta["num_sequences"] and meta["fingerprint"] == json.loads(json.dumps(fingerprint)):
        return folder  # complete: no need to load the target
    target = build_model(teacher_dir, parse_dtype(cfg.teacher.dtype))
    build_teacher_cache(target, TokenData.load(data_file), folder, cfg.teacher, fingerprint)
    return folder


def prepare_ref_kl(cfg: DistillConfig, data_file: Path, teacher: Path) -> Path:
    """KL(p || q_ref) per token, from the finished reference model (fixed, so computed once)."""
    path = cfg.out / "reference" / "ref_kl.safetensors"
    if path.is_file():
        return path
    reference = build_model(cfg.out / "reference" / MODEL_DIR, torch.float32)
    kl = per_token_kl(reference, TokenData.load(data_file), TeacherCache.open(teacher), cfg.teacher.batch_size)
    tmp = path.with_name(path.name + ".partial")
    save_file({"kl": kl.contiguous()}, str(tmp))
    tmp.replace(path)
    return path


def run_job(cfg: DistillConfig, job: StageJob, ctx: DistContext | None = None) -> Path:
    """Run one training stage: on --processes spawned processes, or, under torchrun (ctx active), on the
    processes torchrun started (the main one prepares the stage folder)."""
    ctx = ctx or DistContext()
    ctx.main_only(begin_stage, job)
    if (job.out / DONE).is_file() and (job.out / MODEL_DIR / "config.json").is_file():
        if ctx.is_main:
            print(f"foretell train adaspec: stage {job.out.name} already complete, skipping")
    elif ctx.active:
        run_stage(ctx, job)
    else:
        launch(run_stage, (job,), cfg.processes)
    if not (job.out / DONE).is_file():
        raise ForetellError(f"stage {job.out.name} did not finish; rerun the same command to resume it")
    return job.out / MODEL_DIR


def copy_reference_as_baseline(cfg: DistillConfig, reference: StageJob, baseline: StageJob) -> Path:
    """Plain distillation with the reference's settings is the reference: copy instead of retraining."""
    if not begin_stage(baseline):
        shutil.copytree(reference.out / MODEL_DIR, baseline.out / MODEL_DIR, dirs_exist_ok=True)
        (baseline.out / DONE).write_text(json.dumps({"same_as": "reference"}))
    return baseline.out / MODEL_DIR


RESERVED_NAMES = ("data", "teacher", "init", "finetune", "reference", "distill-all-tokens")


def check_draft_name(name: str) -> None:
    if not name or "/" in name or name.startswith(".") or name in RESERVED_NAMES:
        raise ForetellError(f"--draft-name must be a plain folder name other than {', '.join(RESERVED_NAMES)}; "
                            f"got {name!r}")


def run_pipeline(cfg: DistillConfig, stage: str = "all", ctx: DistContext | None = None) -> dict[str, Path]:
    """Run `stage` (and what it needs); returns the model folders made, by stage name. Under torchrun (ctx
    active) every process runs this: the main one makes the data, teacher cache, draft init and reference KL
    (the others then read them) and every process trains each stage's share of the global batch."""
    ctx = ctx or DistContext()
    processes = ctx.world_size if ctx.active else cfg.processes
    if stage not in STAGES:
        raise ForetellError(f"unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    if not 0.0 < cfg.select_fraction <= 1.0:
        raise ForetellError(f"--select-fraction must be in (0, 1], got {cfg.select_fraction}")
    check_draft_name(cfg.draft_name)
    cfg.train.micro_batches(processes)  # a bad batch split fails before any work
    cfg.adaspec_train().micro_batches(processes)
    cfg.out.mkdir(parents=True, exist_ok=True)
    target_dir = ctx.first(resolve_model_dir, cfg.target)
    tokenizer = load_tokenizer(target_dir)
    data_file = ctx.first(prepare_data, cfg, tokenizer)
    models: dict[str, Path] = {}
    teacher_dir = target_dir

    def resume_for(name: str) -> bool:  # --no-resume redoes the stage asked for, never its prerequisites
        return cfg.resume or stage not in (name, "all")

    if cfg.finetune or stage == "finetune":
        job = StageJob("finetune", target_dir, cfg.out / "finetune", data_file, replace(cfg.train, lr=cfg.finetune_lr),
                       init_sha256=fingerprint_of(target_dir)["weights_sha256"], resume=resume_for("finetune"))
        teacher_dir = models["finetune"] = run_job(cfg, job, ctx)
        if stage == "finetune":
            return models
    teacher = ctx.first(prepare_teacher, cfg, teacher_dir, data_file)
    init = models["init"] = ctx.first(make_init, cfg, target_dir, tokenizer)
    common = dict(init=init, data_file=data_file, train=cfg.train, teacher_dir=teacher,
                  init_sha256=fingerprint_of(init)["weights_sha256"])
    reference = StageJob("distill", out=cfg.out / "reference", resume=resume_for("reference"), **common)
    baseline = StageJob("distill", out=cfg.out / "distill-all-tokens", resume=resume_for("distill-all-tokens"), **common)
    if stage == "distill-all-tokens":
        models["distill-all-tokens"] = run_job(cfg, baseline, ctx)
        return models
    if stage == "draft" and not (reference.out / DONE).is_file():
        raise ForetellError(f"stage draft needs the reference model, not found in {reference.out}; "
                            "run --stage reference first (or --stage all)")
    models["reference"] = run_job(cfg, reference, ctx)
    if stage in ("all", "draft"):
        ref_kl = ctx.first(prepare_ref_kl, cfg, data_file, teacher)
        draft = StageJob("adaspec", out=cfg.out / cfg.draft_name, ref_kl_file=ref_kl, select_fraction=cfg.select_fraction,
                         resume=resume_for("draft"), **{**common, "train": cfg.adaspec_train()})
        models["draft"] = run_job(cfg, draft, ctx)
    if stage == "all":
        models["distill-all-tokens"] = baseline.out / MODEL_DIR
        ctx.main_only(copy_reference_as_baseline, cfg, reference, baseline)
        if ctx.is_main:
            (cfg.out / "models.json").write_text(json.dumps({k: str(v) for k, v in {"target": teacher_dir, **models}.items()}, indent=2))
    return models
