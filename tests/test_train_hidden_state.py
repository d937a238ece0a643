"""`foretell train hidden-state` on tiny models: curriculum, noise, loss, frozen target, resume, eval, CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from foretell.api import load
from foretell.cli import main
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models.hidden_draft import HiddenDraftConfig, load_hidden_draft, new_hidden_draft
from foretell.runtime.loading import build_model
from foretell.train.common.data import TokenData
from foretell.train.common.features import FeatureCache
from foretell.train.common.trainer import WarmupCosine
from foretell.train.hidden_state.eval import hidden_depth_eval, hot_vocab_coverage
from foretell.train.hidden_state.loss import (
    HiddenLossConfig, noise_rows, sequence_terms, unroll, unroll_at, unroll_steps, with_noise,
)
from foretell.train.hidden_state.pipeline import HiddenShape, HiddenStateTrainConfig, run_hidden_state
from foretell.train.hidden_state.train import hidden_step
from foretell.types import SamplingParams
from train_util import (
    SEQ_LEN, VOCAB, assert_resume_repeats_the_run, assert_two_processes_train_like_one, mean_losses, read_log, run_fields,
    tiny_setup,
)

DEPTH = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_setup(tmp_path_factory, "train_hidden", layers=3)


def config(setup, out: Path, loss: HiddenLossConfig = HiddenLossConfig(anchors=8), **train) -> HiddenStateTrainConfig:
    return HiddenStateTrainConfig(**run_fields(setup, out, **train), shape=HiddenShape(depth=DEPTH, token_info_rank=8),
                                  loss=loss, hot_vocab_sizes=(8, 16, 100))


@pytest.fixture(scope="module")
def trained(setup):
    """40 steps, full depth from step 8 on (curriculum 0.3), evaluated on the held-out file."""
    root = setup[0]
    cfg = replace(config(setup, root / "trained", HiddenLossConfig(anchors=8, curriculum=0.3), steps=40, lr=1e-2,
                         warmup_steps=4), eval_sequences=12)
    return cfg, run_hidden_state(cfg)


# --- curriculum and noise --------------------------------------------------------------------


def test_curriculum_grows_the_unrolled_steps_to_the_depth():
    assert [unroll_steps(s, 40, 4, 0.5) for s in range(0, 40, 5)] == [1, 2, 3, 4, 4, 4, 4, 4]  # stages of 40 * 0.5 / 4 steps
    assert [unroll_steps(s, 10, 3, 0.0) for s in (0, 9)] == [3, 3]  # no curriculum: full depth throughout
    assert [unroll_steps(s, 40, 5, 1.0) for s in (7, 8, 31, 32, 39)] == [1, 2, 4, 5, 5]


def test_noise_replaces_the_chosen_share_of_rows_by_other_rows():
    hidden = torch.randn(50, 8)
    positions, sources = noise_rows(50, 0.1, torch.Generator().manual_seed(1))
    assert len(positions) == 5 == len(set(positions.tolist())) and bool((positions != sources).all())
    noisy = with_noise(hidden, 0.1, torch.Generator().manual_seed(1))
    changed = (noisy != hidden).any(-1)
    assert sorted(torch.nonzero(changed).flatten().tolist()) == sorted(positions.tolist())
    assert torch.equal(noisy[positions], hidden[sources])
    assert torch.equal(with_noise(hidden, 0.0, torch.Generator()), hidden)


def test_bad_settings_are_refused():
    for kwargs, message in [({"mse_weight": -1}, "--mse-weight"), ({"mse_weight": 0, "kl_weight": 0}, "not both 0"),
                            ({"noise": 1.0}, "--noise must be in"), ({"logit_clamp": 0}, "--logit-clamp"),
                            ({"curriculum": 2}, "--curriculum"), ({"anchors": 0}, "--anchors"),
                            ({"deep_rows": "some"}, "--deep-rows takes all or anchors")]:
        with pytest.raises(ForetellError, match=message):
            HiddenLossConfig(**kwargs)
    with pytest.raises(ForetellError, match="--init-layer takes middle"):
        HiddenShape(init_layer="top")
    with pytest.raises(ForetellError, match="--depth must be >= 1"):
        HiddenShape(depth=0)


# --- training --------------------------------------------------------------------------------


def test_loss_decreases_and_the_curriculum_is_followed(trained):
    cfg, _ = trained
    log = read_log(cfg.out)
    assert [r["step"] for r in log] == list(range(1, 41))
    assert [r["unroll"] for r in log[:12]] == [1] * 4 + [2] * 4 + [3] * 4  # stages of 40 * 0.3 / 3 steps
    full = log[10:]  # full depth from here on: the same loss throughout
    first, last = mean_losses(full)
    assert last < 0.9 * first, (first, last)
    assert last < 0.7 * sum(r["loss"] for r in log[:5]) / 5  # lower at depth 3 than it started at depth 1
    assert log[-1]["mse"] < log[0]["mse"]
    assert (cfg.out / "train" / "loss.png").stat().st_size > 0


def test_only_the_draft_trains_and_the_target_gets_no_gradient(setup, trained):
    cfg, draft_dir = trained
    saved = load_file(str(draft_dir / "model.safetensors"))
    assert {k.split(".")[0] for k in saved} == {"layer", "norm", "token_info"}  # no embedding, no lm_head
    # One step as the pipeline runs it: the target frozen, every draft weight (W_1, W_2 too) moved by its gradient.
    target = build_model(Path(cfg.target), torch.float32).requires_grad_(False)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    draft = new_hidden_draft(target, HiddenDraftConfig.for_target(target.config, token_info_rank=8), init_from_layer=1)
    draft.token_info.up.weight.data.normal_()  # W_2 starts at 0: give W_1 a gradient in this one step
    start = {k: v.clone() for k, v in draft.state_dict().items()}
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(1, 10, 0.1))
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    hidden_step(draft.requires_grad_(True), FeatureCache.open(cfg.out / "features"), data, torch.arange(2), [0, 1], 9,
                cfg.train, cfg.loss, DEPTH)
    optimizer.step()
    scheduler.step()
    assert all(p.grad is None for p in target.parameters())
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    assert all(not torch.equal(start[k], v) for k, v in draft.state_dict().items()), "a draft weight did not train"
    reference = load_file(str(Path(cfg.target) / "model.safetensors"))
    assert torch.equal(target.lm_head.weight, reference["lm_head.weight"])


def test_resumed_run_matches_an_uninterrupted_one(setup, tmp_path):
    assert_resume_repeats_the_run(run_hidden_state, lambda out: config(setup, out), tmp_path, "draft")
    assert [r["step"] for r in read_log(tmp_path / "split")] == [1, 2, 3, 4, 5, 6]
    assert read_log(tmp_path / "split") == [{**r, "seconds": s["seconds"]} for r, s in
                                            zip(read_log(tmp_path / "whole"), read_log(tmp_path / "split"))]
    before = {f: f.stat().st_mtime_ns for f in (tmp_path / "split").rglob("*") if f.is_file()}
    with pytest.raises(ForetellError, match="other settings \\(--noise was 0.1, now 0.2\\); rerun with --no-resume"):
        run_hidden_state(config(setup, tmp_path / "split", HiddenLossConfig(anchors=8, noise=0.2)))
    assert {f: f.stat().st_mtime_ns for f in (tmp_path / "split").rglob("*") if f.is_file()} == before


def test_init_draft_continues_from_a_trained_draft(setup, trained, tmp_path):
    cfg, trained_dir = trained
    start = load_file(str(trained_dir / "model.safetensors"))
    warm = config(setup, tmp_path / "warm", steps=2, lr=1e-9, warmup_steps=0)
    out = run_hidden_state(replace(warm, init_draft=trained_dir))
    after = load_file(str(out / "model.safetensors"))
    # a near-zero learning rate keeps the weights where the trained draft left them, not at a fresh init
    assert all(torch.allclose(start[k], after[k], atol=1e-5) for k in start)
    cold = load_file(str(run_hidden_state(replace(warm, out=tmp_path / "cold")) / "model.safetensors"))
    assert not torch.allclose(cold["layer.down_proj.weight"], start["layer.down_proj.weight"], atol=1e-3)
    other_rank = replace(warm, out=tmp_path / "bad", shape=HiddenShape(depth=DEPTH, token_info_rank=4))
    with pytest.raises(ForetellError, match="another shape.*token_info_rank"):
        run_hidden_state(replace(other_rank, init_draft=trained_dir))
    with pytest.raises(ForetellError, match="no hidden-state draft folder"):
        run_hidden_state(replace(warm, out=tmp_path / "missing", init_draft=tmp_path / "nowhere"))


# --- evaluation and use ----------------------------------------------------------------------


def test_eval_reports_mse_acceptance_and_hot_vocab_coverage(trained):
    cfg, draft_dir = trained
    result = json.loads((cfg.out / "eval.json").read_text())
    assert result["depth"] == [1, 2, 3] and result["sequences"] == 12 and all(n > 0 for n in result["anchors"])
    for key in ("top1", "top3", "expected_acceptance", "chain_top1"):
        assert all(0.0 <= v <= 1.0 for v in result[key])
    assert all(c <= t + 1e-9 for c, t in zip(result["chain_top1"], result["top1"]))
    assert all(t1 <= t3 + 1e-9 for t1, t3 in zip(result["top1"], result["top3"]))
    coverage = result["hot_vocab"]["coverage"]
    assert list(coverage) == ["8", "16", str(VOCAB)] and coverage[str(VOCAB)] == 1.0
    assert 0.0 < coverage["8"] <= coverage["16"] <= 1.0
    assert "hidden MSE" in (cfg.out / "eval.md").read_text()
    target = build_model(Path(cfg.target), torch.float32)
    held = TokenData.load(cfg.out / "data" / "train.safetensors")
    held = TokenData(held.input_ids[:12], held.loss_mask[:12])
    after = hidden_depth_eval(target, load_hidden_draft(draft_dir, target), held, DEPTH)
    before = hidden_depth_eval(target, new_hidden_draft(target, load_hidden_draft(draft_dir, target).config,
                                                        init_from_layer=1), held, DEPTH)
    assert after["mse"][0] < before["mse"][0] and after["top1"][0] > before["top1"][0]


def test_hot_vocab_coverage_by_hand():
    train = TokenData(torch.tensor([[0, 5, 5, 6, 7]]), torch.tensor([[True, True, True, True, False]]))
    held = TokenData(torch.tensor([[0, 5, 9, 6]]), torch.tensor([[True, True, True, False]]))
    report = hot_vocab_coverage(train, held, (1, 2), vocab_size=10)
    assert report["train_tokens"] == 4 and report["held_out_tokens"] == 3
    assert report["coverage"] == {"1": round(1 / 3, 4), "2": round(2 / 3, 4)}  # {5}, then {5, 6}


def test_trained_draft_decodes_exactly_like_plain_greedy(trained):
    cfg, draft_dir = trained
    spec = load(cfg.target, SpeculativeConfig(method='hidden-state', model=str(draft_dir), draft_quant="none"), warm_up=False)
    plain = load(cfg.target, "none", warm_up=False)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    for prompt in ([1, 5, 9, 12, 5, 9, 30], [1, 20, 21, 22, 23]):
        assert spec.engine.generate(prompt, params).tokens == plain.engine.generate(prompt, params).tokens


# --- command line ----------------------------------------------------------------------------


def test_cli_end_to_end(setup, tmp_path, capsys):
    root, target, data, held_out = setup
    out = tmp_path / "cli"
    argv = ["train", "hidden-state", "--target", str(target), "--data", str(data), "--eval-data", str(held_out),
            "--seq-len", str(SEQ_LEN), "--steps", "3", "--batch-size", "2", "--anchors", "4", "--depth", "2",
            "--token-info-rank", "4", "--init-layer", "random", "--mse-weight", "0.5", "--kl-weight", "0.5",
            "--noise", "0.2", "--curriculum", "0", "--logit-clamp", "10", "--topk-teacher", "8",
            "--hot-vocab-sizes", "10,20", "--eval-sequences", "4", "--checkpoint-every", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "hidden MSE" in printed and "| hot tokens | coverage |" in printed and f"draft: {out / 'draft'}" in printed
    assert list(json.loads((out / "eval.json").read_text())["hot_vocab"]["coverage"]) == ["10", "20"]
    assert load_hidden_draft(out / "draft", build_model(target, torch.float32)).config.token_info_rank == 4
    assert main(argv) == 0  # a finished run is skipped, and evaluated again
    assert "already trained" in capsys.readouterr().out
    for draft in (out / "draft", out):  # the run's folder names the draft it saved
        assert main(["generate", "--model", str(target), "--hidden-draft", str(draft), "w5 w9", "--max-new-tokens", "5"]) == 0


def test_cli_errors_are_one_line(setup, tmp_path, capsys):
    root, target, data, _ = setup
    base = ["train", "hidden-state", "--target", str(target), "--seq-len", str(SEQ_LEN), "--out", str(tmp_path / "e")]
    cases = [
        (["--data", str(tmp_path / "missing.jsonl")], "no data"),
        (["--data", str(data), "--noise", "1.5"], "--noise must be in [0, 1)"),
        (["--data", str(data), "--steps", "0"], "--steps must be >= 1"),
        (["--data", str(data), "--init-layer", "7", "--eval-sequences", "0"], "--init-layer must be a target layer in 0..2"),
        (["--data", str(data), "--hot-vocab-sizes", "8,x"], "--hot-vocab-sizes takes"),
        (["--data", str(data), "--kl-weight", "-1"], "--kl-weight"),
        (["--data", str(data), "--draft-vocab", "-1"], "--draft-vocab must be >= 0"),
        (["--data", str(data), "--eval-data", str(tmp_path / "gone.jsonl")], "(--eval-data): it does not exist"),
    ]
    for extra, message in cases:
        assert main(base + extra) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].startswith("foretell: error:") and message in lines[-1], lines
    assert not (tmp_path / "e").exists()  # each was refused before anything was written


def test_unroll_equals_forward_training(setup):
    target = build_model(setup[1], torch.float32)
    draft = new_hidden_draft(target, HiddenDraftConfig.for_target(target.config, token_info_rank=4), init_from_layer=1)
    hidden = target.forward_sequences(torch.randint(3, VOCAB, (2, 20)), hidden_layers=(3,)).hidden[3]
    for steps in (1, 3):
        torch.testing.assert_close(unroll(draft, hidden, steps), draft.forward_training(hidden, steps))
    one = hidden[:1, :12]  # short blocks take the layer's small-step attention path
    torch.testing.assert_close(unroll(draft, one, 4), draft.forward_training(one, 4), atol=1e-4, rtol=1e-3)


def test_anchored_unroll_equals_the_full_unroll_at_its_anchors(setup):
    """--deep-rows anchors: each anchor's chain needs only the target rows and its own predictions, so unrolling
    from the anchors alone gives the very predictions of the full unroll there (and step 0 at every row)."""
    target = build_model(setup[1], torch.float32)
    draft = new_hidden_draft(target, HiddenDraftConfig.for_target(target.config, token_info_rank=4), init_from_layer=1)
    hidden = target.forward_sequences(torch.randint(3, VOCAB, (1, 24)), hidden_layers=(3,)).hidden[3]
    for rows in (torch.tensor([0, 5, 6, 17, 22]), torch.tensor([9])):  # one anchor: the small-step attention path
        for steps in (1, 2, 4):
            full = unroll(draft, hidden, steps)[0]
            first, deep = unroll_at(draft, hidden, steps, rows)
            torch.testing.assert_close(first, full[:, 0])
            torch.testing.assert_close(deep, full[rows, 1:], atol=1e-5, rtol=1e-4)


def test_anchored_loss_terms_are_the_full_terms_on_their_pairs(setup):
    """The KL terms are identical, and the MSE is the full MSE on step 0 and at the anchors (elsewhere not trained)."""
    target = build_model(setup[1], torch.float32)
    draft = new_hidden_draft(target, HiddenDraftConfig.for_target(target.config, token_info_rank=4), init_from_layer=1)
    tokens = torch.randint(3, VOCAB, (24,))
    hidden = target.forward_sequences(tokens[None], hidden_layers=(3,)).hidden[3][0]
    logp, ids = torch.log_softmax(torch.randn(24, 6), -1), torch.randint(0, VOCAB, (24, 6))
    mask = torch.ones(24, dtype=torch.bool)
    mask[:3] = False
    anchors = torch.tensor([4, 9, 10, 19])
    full, anchored = (sequence_terms(draft, hidden, logp, ids, tokens, mask, 3, anchors,
                                     HiddenLossConfig(deep_rows=rows, noise=0.2), torch.Generator().manual_seed(1))
                      for rows in ("all", "anchors"))
    torch.testing.assert_close(anchored.kl, full.kl)
    assert torch.equal(anchored.kl_valid, full.kl_valid) and torch.equal(anchored.agree, full.agree)
    assert torch.equal(anchored.mse_valid[:, 0], full.mse_valid[:, 0])
    assert torch.equal(anchored.mse_valid[:, 1:].nonzero()[:, 0].unique(), anchors[anchors < 21])
    assert torch.equal(anchored.mse_valid, full.mse_valid & anchored.mse_valid)
    pairs = anchored.mse_valid
    torch.testing.assert_close(anchored.mse[pairs], full.mse[pairs])


def test_two_processes_match_one_with_the_same_global_batch(setup, tmp_path):
    """Data-parallel (2 gloo processes, a sharded feature pass) == 1 process at the same global batch; noise rows
    and anchors are functions of (seed, step, sequence), so each process draws what one process would."""
    assert_two_processes_train_like_one(run_hidden_state, lambda out: config(setup, out, steps=3), tmp_path, "draft")
    log, first = read_log(tmp_path / "two"), read_log(tmp_path / "one")
    assert [(r["unroll"], round(r["loss"], 4)) for r in log] == [(r["unroll"], round(r["loss"], 4)) for r in first]


# --- a draft vocabulary (--draft-vocab) --------------------------------------------------------


def test_a_whole_vocabulary_draft_vocab_gives_the_full_drafts_terms_and_a_smaller_one_masks_pairs(setup):
    """KL to the target restricted to the draft's vocabulary: with every id in it, the very terms of a
    full-vocabulary draft with the same weights; with fewer, logits over its ids only, and the pairs whose target
    top-1 it cannot draft left out."""
    target = build_model(setup[1], torch.float32)
    tokens = torch.randint(3, VOCAB, (24,), generator=torch.Generator().manual_seed(2))
    hidden = target.forward_sequences(tokens[None], hidden_layers=(3,)).hidden[3][0]
    logp, ids = torch.log_softmax(torch.randn(24, 6), -1), torch.randint(0, VOCAB, (24, 6))
    mask, anchors = torch.ones(24, dtype=torch.bool), torch.tensor([2, 7, 11, 16])
    cfg = HiddenLossConfig(noise=0.0)

    def terms(draft):
        return sequence_terms(draft, hidden, logp, ids, tokens, mask, 3, anchors, cfg, torch.Generator().manual_seed(1))

    full = new_hidden_draft(target, HiddenDraftConfig.for_target(target.config, 4), seed=3, init_from_layer=1)
    whole = new_hidden_draft(target, HiddenDraftConfig.for_target(target.config, 4, draft_vocab_size=VOCAB), seed=3,
                             init_from_layer=1)
    a, b = terms(full), terms(whole)
    torch.testing.assert_close(b.kl, a.kl)
    assert torch.equal(b.kl_valid, a.kl_valid) and torch.equal(b.agree, a.agree)
    vocab = torch.arange(0, VOCAB, 2)  # the even ids
    half = new_hidden_draft(target, HiddenDraftConfig.for_target(target.config, 4, draft_vocab_size=len(vocab)),
                            init_from_layer=1, draft_vocab=vocab)
    assert half.token_info.up.weight.shape == (len(vocab), 4) and torch.equal(half.output_ids, vocab)
    c = terms(half)
    at = anchors[:, None] + torch.arange(1, 4)
    assert torch.equal(c.kl_valid, a.kl_valid & (ids[at, 0] % 2 == 0))
    assert bool(torch.isfinite(c.kl).all())


def test_a_draft_vocabulary_run_saves_its_ids_and_decodes_exactly(setup, tmp_path):
    from foretell.hot_vocab import HotVocab
    from foretell.train.common.data import TokenData as Data
    from foretell.train.common.draft_vocab import draft_vocabulary

    cfg = config(setup, tmp_path / "vocab", steps=4, warmup_steps=0)
    cfg = replace(cfg, shape=replace(cfg.shape, draft_vocab=20), eval_sequences=4)
    draft_dir = run_hidden_state(cfg)
    target = build_model(Path(cfg.target), torch.float32)
    draft = load_hidden_draft(draft_dir, target, hot=HotVocab(torch.arange(10), VOCAB))  # its own vocabulary wins
    data = Data.load(cfg.out / "data" / "train.safetensors")
    assert torch.equal(draft.output_ids.cpu(), draft_vocabulary(data, 20, VOCAB, [0, 1, 2]))
    assert draft.config.draft_vocab_size == 20 and load_file(str(draft_dir / "model.safetensors"))[
        "token_info.up.weight"].shape == (20, 8)
    assert json.loads((cfg.out / "eval.json").read_text())["top1"][0] >= 0.0
    spec = load(cfg.target, SpeculativeConfig(method="hidden-state", model=str(draft_dir), draft_quant="none"),
                warm_up=False)
    plain = load(cfg.target, "none", warm_up=False)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    for prompt in ([1, 5, 9, 12, 5, 9, 30], [1, 20, 21, 22, 23]):
        assert spec.engine.generate(prompt, params).tokens == plain.engine.generate(prompt, params).tokens


def test_a_bad_draft_vocabulary_is_refused(setup):
    target = build_model(setup[1], torch.float32)
    with pytest.raises(ForetellError, match="draft_vocab_size must be in 0..48"):
        HiddenDraftConfig.for_target(target.config, draft_vocab_size=VOCAB + 1)
    with pytest.raises(ForetellError, match="4 distinct ascending target ids"):
        new_hidden_draft(target, HiddenDraftConfig.for_target(target.config, draft_vocab_size=4),
                         draft_vocab=torch.tensor([3, 2, 5, 9]))
    with pytest.raises(ForetellError, match="--draft-vocab must be >= 0"):
        HiddenShape(draft_vocab=-1)
