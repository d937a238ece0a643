"""Draft training (AdaSPEC pipeline) on tiny models: losses, filter, resume, DDP, saving, alpha, errors."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_hf_model, make_tokenizer, save_model_folder as save_hf
from foretell.cli import main
from foretell.conversations import sharegpt_messages, sharegpt_objects
from foretell.errors import ForetellError
from foretell.models.derive import DraftShape, draft_from_config, save_model_folder, truncated_copy
from foretell.runtime.loading import build_model, load_model
from foretell.train.adaspec.evaluate import acceptance_per_token, token_acceptance
from foretell.train.adaspec.losses import adaspec_loss, keep_count, select_tokens
from foretell.train.adaspec.pipeline import DistillConfig, DraftSpec, run_pipeline
from foretell.train.adaspec.stages import StageJob, begin_stage, run_stage
from foretell.train.adaspec.teacher import TeacherConfig
from foretell.train.common.data import DataConfig, TokenData, build_token_data, tokenize_conversation
from foretell.train.common.distributed import launch
from foretell.train.common.topk import full_kl, topk_kl
from foretell.train.common.trainer import TrainConfig, WarmupCosine

VOCAB = 48
SEQ_LEN = 24


def write_dataset(path: Path, rows: int = 32, seed: int = 0) -> Path:
    """Question -> answer pairs over the tiny word vocabulary, with a learnable rule."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            q = [rng.randrange(3, VOCAB - 3) for _ in range(rng.randrange(2, 6))]
            answer = " ".join(f"w{(i * 7) % 45}" for i in q)
            f.write(json.dumps({"question": " ".join(f"w{i}" for i in q), "answer": answer}) + "\n")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A tiny target, a dataset and a pipeline run up to the reference model (teacher cache, init, ref)."""
    root = tmp_path_factory.mktemp("distill")
    target = save_hf(root / "target", make_hf_model("llama", VOCAB, seed=0), make_tokenizer(VOCAB))
    data = write_dataset(root / "data.jsonl")
    cfg = DistillConfig(
        str(target), root / "out", DataConfig(str(data), seq_len=SEQ_LEN), DraftSpec(layers=1),
        TrainConfig(steps=4, batch_size=4, micro_batch_size=2, checkpoint_every=2), TeacherConfig(top_k=8),
    )
    models = run_pipeline(cfg, "reference")
    return cfg, models


def adaspec_job(cfg: DistillConfig, out: Path, **train) -> StageJob:
    from foretell.train.adaspec.pipeline import prepare_ref_kl

    data_file = cfg.out / "data" / "train.safetensors"
    ref_kl = prepare_ref_kl(cfg, data_file, cfg.out / "teacher")
    return StageJob("adaspec", cfg.out / "init" / "model", out, data_file, replace(cfg.train, **train),
                    teacher_dir=cfg.out / "teacher", ref_kl_file=ref_kl, select_fraction=0.4)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model" / "model.safetensors"))


# --- losses and the token filter -------------------------------------------------------------


def test_filter_keeps_exactly_the_top_fraction_of_valid_tokens():
    delta = torch.tensor([[0.5, -1.0, 3.0, 2.0, 7.0]])
    valid = torch.tensor([[True, True, True, False, True]])
    assert select_tokens(delta, valid, 0.5).tolist() == [[False, False, True, False, True]]  # 3.0 and 7.0; 2.0 is invalid

    g = torch.Generator().manual_seed(0)
    delta = torch.randn(4, 37, generator=g)
    valid = torch.rand(4, 37, generator=g) > 0.3
    keep = select_tokens(delta, valid, 0.4)
    n = int(valid.sum())
    assert int(keep.sum()) == keep_count(n, 0.4) == round(0.4 * n)
    assert not (keep & ~valid).any()
    assert delta[keep].min() >= delta[valid & ~keep].max()


def test_adaspec_loss_trains_only_the_selected_tokens():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, VOCAB, generator=g, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(2, 6, VOCAB, generator=g), -1).topk(8, dim=-1)
    valid = torch.ones(2, 6, dtype=torch.bool)
    ref_kl = torch.rand(2, 6, generator=g)
    loss, stats = adaspec_loss(logits, teacher.values, teacher.indices, ref_kl, valid, 0.25)
    loss.backward()
    keep = select_tokens(topk_kl(logits, teacher.values, teacher.indices).detach() - ref_kl, valid, 0.25)
    assert stats["selected"] == 3 == int(keep.sum())
    touched = logits.grad.abs().sum(-1) > 0
    assert torch.equal(touched, keep)


def test_topk_kl_equals_full_kl_when_k_is_the_vocabulary():
    g = torch.Generator().manual_seed(2)
    p_logits = torch.randn(3, 5, VOCAB, generator=g) * 3
    q_logits = (torch.randn(3, 5, VOCAB, generator=g) * 3).requires_grad_()
    log_p = torch.log_softmax(p_logits, -1)
    full = full_kl(p_logits, q_logits)
    top = log_p.topk(VOCAB, dim=-1)
    from_cache = topk_kl(q_logits, top.values, top.indices)
    torch.testing.assert_close(from_cache, full, atol=1e-5, rtol=1e-5)
    grad_full, = torch.autograd.grad(full.sum(), q_logits)
    grad_cache, = torch.autograd.grad(from_cache.sum(), q_logits)
    torch.testing.assert_close(grad_cache, grad_full, atol=1e-5, rtol=1e-5)
    small = log_p.topk(4, dim=-1)
    coarse = topk_kl(q_logits, small.values, small.indices)
    assert (coarse >= -1e-6).all() and (coarse <= full + 1e-5).all()  # coarsening never raises the KL
    assert torch.isfinite(torch.autograd.grad(coarse.sum(), q_logits)[0]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sequence_topk_in_row_slices_equals_the_whole_batchs_logits(tmp_path, monkeypatch, dtype):
    from foretell.runtime.wide_linear import widen_linears
    from foretell.train.common import topk

    folder = save_hf(tmp_path / "m", make_hf_model("llama", 48, seed=4), make_tokenizer(48))
    model = build_model(folder, dtype).requires_grad_(False)
    widen_linears(model, wide_rows=4, kernel=0)  # bf16: every slice (>= 4 rows) multiplies in fp32, as a whole batch
    ids = torch.randint(0, 48, (3, 23), generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(topk, "LOGIT_ROWS", 16)  # 69 rows: slices of 16, the last 5 joining the one before
    logp, top_ids, lse, hidden = topk.sequence_topk(model, ids, 6, hidden_layers=(1,))
    out = model.forward_sequences(ids, hidden_layers=(1,))
    want = topk.topk_of_logits(out.logits, 6)
    assert torch.equal(logp, want[0]) and torch.equal(top_ids, want[1]) and torch.equal(lse, want[2])
    assert logp.shape == (3, 23, 6) and torch.equal(hidden[1], out.hidden[1]) and list(hidden) == [1]


def test_warmup_then_cosine_down_to_a_tenth():
    s = WarmupCosine(warmup=4, total=20, min_ratio=0.1)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(4) == pytest.approx(1.0) and s(20) == pytest.approx(0.1) and s(12) == pytest.approx(0.55)


# --- data -----------------------------------------------------------------------------------


def test_loss_mask_covers_the_assistant_tokens_only():
    tok = make_tokenizer(VOCAB)
    messages = [{"role": "user", "content": "w3 w4"}, {"role": "assistant", "content": "w5 w6"},
                {"role": "user", "content": "w7"}, {"role": "assistant", "content": "w8"}]
    ids, flags = tokenize_conversation(tok, messages)
    words = tok.convert_ids_to_tokens(ids)
    assert [w for w, f in zip(words, flags) if f] == ["w5", "w6", "<|im_end|>", "w8", "<|im_end|>"]


def test_sharegpt_decoding_survives_a_file_cut_mid_string():
    text = '[\n {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},\n {"id": "b", "conv'
    objects = list(sharegpt_objects(text))
    assert [o["id"] for o in objects] == ["a"]
    assert sharegpt_messages(objects[0]["conversations"]) == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert sharegpt_messages([{"from": "gpt", "value": "starts with the model"}]) is None


def test_packing_fills_every_row(tmp_path):
    tok = make_tokenizer(VOCAB)
    source = str(write_dataset(tmp_path / "d.jsonl", rows=20))
    packed = build_token_data(DataConfig(source, seq_len=16, pack=True), tok)
    padded = build_token_data(DataConfig(source, seq_len=16, pack=False), tok)
    assert len(padded) == 20 and packed.input_ids.shape[1] == 16
    assert (packed.input_ids != tok.eos_token_id).float().mean() > (padded.input_ids != tok.eos_token_id).float().mean()
    assert not packed.loss_mask[:, -1].any()


# --- training: resume and DDP ---------------------------------------------------------------


def test_resumed_run_matches_an_uninterrupted_one(prepared, tmp_path):
    cfg, _ = prepared
    whole = adaspec_job(cfg, tmp_path / "whole", steps=5, checkpoint_every=2)
    begin_stage(whole)
    run_stage(launch_context(), whole)
    split = adaspec_job(cfg, tmp_path / "split", steps=5, checkpoint_every=2)
    begin_stage(split)
    run_stage(launch_context(), replace(split, stop_after=3))
    assert not (split.out / "model").exists()
    run_stage(launch_context(), split)
    a, b = weights(whole.out), weights(split.out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    log = [json.loads(line) for line in (split.out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5]
    assert (split.out / "loss.png").stat().st_size > 0


def launch_context():
    from foretell.train.common.distributed import DistContext

    return DistContext()


def test_two_ddp_processes_match_one_with_the_same_global_batch(prepared, tmp_path):
    cfg, _ = prepared
    one = adaspec_job(cfg, tmp_path / "one", steps=3)
    two = adaspec_job(cfg, tmp_path / "two", steps=3)
    for job, processes in ((one, 1), (two, 2)):
        begin_stage(job)
        launch(run_stage, (job,), processes, threads=1)
    a, b = weights(one.out), weights(two.out)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)
    assert any(not torch.equal(a[k], load_file(str(cfg.out / "init/model/model.safetensors"))[k]) for k in a)


def test_pipeline_reuses_finished_stages_and_copies_the_baseline(prepared):
    cfg, models = prepared
    before = (models["reference"] / "model.safetensors").stat().st_mtime_ns
    again = run_pipeline(cfg, "all")
    assert (again["reference"] / "model.safetensors").stat().st_mtime_ns == before
    a, b = weights(again["reference"].parent), weights(again["distill-all-tokens"].parent)
    assert all(torch.equal(a[k], b[k]) for k in a)
    draft, init = weights(again["draft"].parent), weights(again["init"].parent)
    assert any(not torch.equal(draft[k], init[k]) for k in draft)


def test_a_select_fraction_sweep_shares_the_reference(prepared):
    cfg, models = prepared
    before = (models["reference"] / "model.safetensors").stat().st_mtime_ns
    k04 = run_pipeline(cfg, "draft")["draft"]
    k08 = run_pipeline(replace(cfg, select_fraction=0.8, draft_name="draft-k0.8"), "draft")["draft"]
    assert k08 == cfg.out / "draft-k0.8" / "model"
    assert (models["reference"] / "model.safetensors").stat().st_mtime_ns == before
    a, b = weights(k04.parent), weights(k08.parent)
    assert any(not torch.equal(a[k], b[k]) for k in a), "another k trained on other tokens"
    with pytest.raises(ForetellError, match="--draft-name"):
        run_pipeline(replace(cfg, draft_name="reference"), "draft")


def test_adaspec_batch_size_changes_only_the_selective_stage(prepared):
    cfg, models = prepared
    before = (models["reference"] / "model.safetensors").stat().st_mtime_ns
    wide = replace(cfg, adaspec_batch_size=8, draft_name="draft-b8")
    draft = run_pipeline(wide, "draft")["draft"]
    assert (models["reference"] / "model.safetensors").stat().st_mtime_ns == before, "the reference keeps its batch"
    job = json.loads((draft.parent / "job.json").read_text())
    assert job["train"]["batch_size"] == 8 and job["train"]["steps"] == cfg.train.steps
    with pytest.raises(ForetellError, match="multiple of micro batch"):
        run_pipeline(replace(cfg, adaspec_batch_size=3, draft_name="draft-b3"), "draft")
    assert not (cfg.out / "draft-b3").exists(), "a bad split fails before any work"


def test_finetune_stage_changes_the_teacher(prepared, tmp_path):
    cfg, _ = prepared
    tuned = replace(cfg, out=tmp_path / "ft", finetune=True, train=replace(cfg.train, steps=2))
    models = run_pipeline(tuned, "finetune")
    assert set(models) == {"finetune"}
    a, b = weights(models["finetune"].parent), load_file(str(Path(cfg.target) / "model.safetensors"))
    assert any(not torch.equal(a[k], b[k]) for k in a)
    assert not (tuned.out / "teacher").exists()  # only the asked-for stage ran


# --- saving and evaluation ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_saved_drafts_load_in_foretell_and_transformers_with_equal_logits(kind, tmp_path):
    from transformers import AutoModelForCausalLM

    target = load_model(save_hf(tmp_path / "t", make_hf_model(kind, VOCAB, seed=3), make_tokenizer(VOCAB)))
    ids = torch.tensor([[1, 5, 9, 13, 21, 40]])
    drafts = {"truncated": truncated_copy(target.model, 1),
              "random": draft_from_config(target.model, DraftShape(1, hidden_size=32), seed=4)}
    for name, draft in drafts.items():
        folder = save_model_folder(draft, target.tokenizer, tmp_path / name)
        ours = load_model(folder).model
        theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            expected = draft.forward_sequences(ids).logits
            torch.testing.assert_close(ours.forward_sequences(ids).logits, expected, atol=0, rtol=0)
            torch.testing.assert_close(theirs(ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_alpha_is_the_mean_overlap_of_p_and_q():
    p = torch.tensor([0.5, 0.3, 0.2]).log()
    q = torch.tensor([0.2, 0.3, 0.5]).log()
    assert acceptance_per_token(p, q).item() == pytest.approx(0.2 + 0.3 + 0.2)


def test_alpha_of_a_draft_matches_a_hand_computation(prepared):
    cfg, models = prepared
    target, draft = build_model(Path(cfg.target), torch.float32), build_model(models["reference"], torch.float32)
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    data = TokenData(data.input_ids[:5], data.loss_mask[:5])
    alpha = token_acceptance(target, {"d": draft}, data, batch_size=2)["d"]
    overlaps = []
    for ids, mask in zip(data.input_ids, data.loss_mask):  # one sequence at a time through the decoding forward
        positions = torch.arange(len(ids))
        p = torch.softmax(target(ids, positions, target.new_cache(len(ids))).logits, -1)
        q = torch.softmax(draft(ids, positions, draft.new_cache(len(ids))).logits, -1)
        overlaps += [sum(min(a, b) for a, b in zip(p[t].tolist(), q[t].tolist())) for t in range(len(ids)) if mask[t]]
    assert alpha == pytest.approx(sum(overlaps) / len(overlaps), abs=1e-5)


def test_eval_draft_cli_reports_alpha_and_real_decoding(prepared, tmp_path, capsys):
    cfg, models = prepared
    rows_file = tmp_path / "rows.json"
    argv = ["eval-draft", "--target", cfg.target, "--draft", str(models["init"]), "--draft", f"ref={models['reference']}",
            "--data", cfg.data.source, "--num-sequences", "6", "--seq-len", str(SEQ_LEN), "--prompts", "2",
            "--max-new-tokens", "6", "--json", str(rows_file)]
    assert main(argv) == 0
    rows = json.loads(rows_file.read_text())
    assert [r["draft"] for r in rows] == ["init", "ref"]
    for r in rows:
        assert 0 < r["alpha"] <= 1 and 0 <= r["acceptance_rate"] <= 1 and r["tau"] >= 1 and r["speedup"] > 0
        assert 0 <= r["first_acceptance"] <= 1
    assert "| init |" in capsys.readouterr().out
    greedy_file = tmp_path / "greedy.json"  # greedy decoding; alpha stays at its own temperature
    assert main([*argv[:-1], str(greedy_file), "--decode-temperature", "0"]) == 0
    greedy = json.loads(greedy_file.read_text())
    assert [r["alpha"] for r in greedy] == [r["alpha"] for r in rows]
    assert all(0 <= r["acceptance_rate"] <= 1 and r["tau"] >= 1 for r in greedy)


# --- errors ---------------------------------------------------------------------------------


def test_corrupt_checkpoint_is_a_clear_error(prepared, tmp_path):
    cfg, _ = prepared
    job = adaspec_job(cfg, tmp_path / "corrupt", steps=4)
    begin_stage(job)
    (job.out / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ForetellError, match="corrupt"):
        run_stage(launch_context(), job)


def test_cli_errors_are_one_line(prepared, tmp_path, capsys):
    cfg, _ = prepared
    other = save_hf(tmp_path / "other", make_hf_model("llama", VOCAB, seed=5), make_tokenizer(VOCAB, shift=3))
    cases = [
        (["eval-draft", "--target", cfg.target, "--draft", str(other), "--data", cfg.data.source], "different tokenizers"),
        (["eval-draft", "--target", cfg.target, "--draft", str(tmp_path / "missing"), "--data", cfg.data.source], "no model"),
        (["eval-draft", "--target", cfg.target, "--draft", str(other), "--decode-temperature", "-1"],
         "--decode-temperature must be >= 0"),
        (["train", "adaspec", "--target", cfg.target, "--stage", "draft", "--data", cfg.data.source, "--out", str(tmp_path / "new"),
          "--seq-len", str(SEQ_LEN), "--steps", "2", "--batch-size", "4", "--topk-teacher", "8"], "needs the reference"),
        (["train", "adaspec", "--target", cfg.target, "--out", str(tmp_path / "x"), "--batch-size", "6", "--micro-batch-size", "4"],
         "multiple of micro batch"),
        # The options every training kind shares are checked alike (here for AdaSPEC).
        (["train", "adaspec", "--target", cfg.target, "--out", str(tmp_path / "x"), "--lr", "0"], "--lr must be > 0"),
        (["train", "adaspec", "--target", cfg.target, "--out", str(tmp_path / "x"), "--warmup", "-1"], "--warmup must be >= 0"),
        (["train", "adaspec", "--target", cfg.target, "--out", str(tmp_path / "x"), "--threads", "0"], "--threads must be >= 1"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("foretell: error:") and message in err


def test_a_trained_draft_folder_is_a_valid_init(prepared, tmp_path, capsys):
    """--draft-init FOLDER starts both the reference and AdaSPEC from that draft's weights (a warm start)."""
    cfg, models = prepared
    warm = replace(cfg, out=tmp_path / "warm", draft=DraftSpec(init=str(models["reference"])))
    init = run_pipeline(warm, "reference")["init"]
    start, source = load_file(str(init / "model.safetensors")), load_file(str(models["reference"] / "model.safetensors"))
    assert start.keys() == source.keys() and all(torch.equal(start[k], source[k]) for k in start)
    assert main(["train", "adaspec", "--target", cfg.target, "--data", cfg.data.source, "--draft-init", str(tmp_path / "nowhere"),
                 "--out", str(tmp_path / "bad")]) == 2
    assert "--draft-init" in capsys.readouterr().err


# --- the pretrained-draft regime (issue 55): Qwen2-shaped pair, teacher cache, lossless speculation -------------


@pytest.fixture(scope="module")
def qwen_pair(tmp_path_factory):
    """A tiny Qwen2-shaped target (q/k/v biases, tied embeddings) and a draft distilled from it by the pipeline's
    reference stage. The token data is written directly: transformers reads the word-level test tokenizer of a
    Qwen2 folder as Qwen2's own BPE class, which splits none of its words."""
    root = tmp_path_factory.mktemp("qwen-distill")
    target = save_hf(root / "target", make_hf_model("qwen2", VOCAB, seed=6), make_tokenizer(VOCAB))
    cfg = DistillConfig(
        str(target), root / "out", DataConfig(str(root / "unused.jsonl"), seq_len=SEQ_LEN), DraftSpec(layers=1),
        TrainConfig(steps=3, batch_size=4, micro_batch_size=2, checkpoint_every=2), TeacherConfig(top_k=8),
    )
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (16, SEQ_LEN), generator=g)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, SEQ_LEN // 3:] = True
    (cfg.out / "data").mkdir(parents=True)
    TokenData(ids, mask).save(cfg.out / "data" / "train.safetensors")
    (cfg.out / "data" / "data.json").write_text(json.dumps(asdict(cfg.data), sort_keys=True))
    return cfg, run_pipeline(cfg, "reference")


def test_an_interrupted_teacher_pass_resumes_to_the_same_cache(prepared, tmp_path, monkeypatch):
    import numpy as np

    from foretell.train.adaspec import teacher as teacher_module
    from foretell.train.adaspec.teacher import build_teacher_cache

    cfg, _ = prepared
    target = build_model(Path(cfg.target), torch.float32)
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    whole = build_teacher_cache(target, data, tmp_path / "whole", cfg.teacher, {"t": 1})

    real, calls = teacher_module.topk_log_probs, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the user's ^C during the third batch
        return real(*args)

    monkeypatch.setattr(teacher_module, "topk_log_probs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_teacher_cache(target, data, tmp_path / "split", cfg.teacher, {"t": 1})
    assert json.loads((tmp_path / "split" / "meta.json").read_text())["done"] == 2 * cfg.teacher.batch_size
    with pytest.raises(ForetellError, match="incomplete"):
        teacher_module.TeacherCache.open(tmp_path / "split")
    monkeypatch.setattr(teacher_module, "topk_log_probs", real)
    resumed = build_teacher_cache(target, data, tmp_path / "split", cfg.teacher, {"t": 1})
    for name in ("logp", "ids", "lse"):
        assert np.array_equal(getattr(whole, name), getattr(resumed, name)), name
    with pytest.raises(ForetellError, match="other settings"):
        build_teacher_cache(target, data, tmp_path / "split", cfg.teacher, {"t": 2})


def test_a_distilled_qwen2_draft_speculates_exactly_like_plain_greedy(qwen_pair):
    from foretell.api import load
    from foretell.config import SpeculativeConfig
    from foretell.types import SamplingParams

    cfg, models = qwen_pair
    draft = models["reference"]
    init = load_file(str(models["init"] / "model.safetensors"))
    trained = load_file(str(draft / "model.safetensors"))
    assert any(not torch.equal(init[k], trained[k]) for k in init), "the reference stage changed the draft"
    pipe = load(cfg.target, SpeculativeConfig(method="draft-model", model=str(draft), gamma=3, draft_quant="none"),
                warm_up=False)
    greedy = SamplingParams(max_new_tokens=20, ignore_eos=True)
    for prompt in ([3, 9, 14, 30], [20, 5]):
        spec = pipe.engine.generate(prompt, greedy)
        plain = pipe.plain_engine().generate(prompt, greedy)
        assert spec.tokens == plain.tokens and len(plain.tokens) == 20
        assert spec.stats.draft_tokens_verified > 0


def test_a_shipped_distilled_qwen2_draft_loads_by_name_with_its_checksums(qwen_pair, tmp_path):
    """A distilled draft model ships like the heads (bf16 weights, tokenizer, manifest of checksums); loaded by
    name it speculates exactly like plain greedy, and a damaged file is refused before any drafting."""
    from foretell.config import SpeculativeConfig
    from foretell.build import DrafterWeights, build_engine
    from foretell.runtime.loading import load_model
    from foretell.models.shipped import Manifest, ship_drafter
    from foretell.types import SamplingParams

    cfg, models = qwen_pair
    target = load_model(cfg.target)
    root = tmp_path / "shipped"
    ship_drafter(models["reference"], "tiny-qwen-draft", "draft-model", "tiny-qwen", target.model,
                 {"method": "draft-model", "gamma": 3}, {"command": "a test"}, root=root)
    manifest = Manifest.read(root / "tiny-qwen-draft")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest.files)

    def engine():
        weights = DrafterWeights(target, "tiny-qwen", shipped_root=root)
        spec = SpeculativeConfig(method="draft-model", model="tiny-qwen-draft", gamma=3, draft_quant="none")
        return build_engine(spec, weights)

    plain = build_engine(SpeculativeConfig(method="none"), DrafterWeights(target, "tiny-qwen"))
    greedy = SamplingParams(max_new_tokens=16, ignore_eos=True)
    spec_engine = engine()
    for prompt in ([3, 9, 14, 30], [20, 5]):
        out = spec_engine.generate(prompt, greedy)
        assert out.tokens == plain.generate(prompt, greedy).tokens and out.stats.draft_tokens_verified > 0
    weights = root / "tiny-qwen-draft" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ForetellError, match="damaged: model.safetensors"):
        engine()
