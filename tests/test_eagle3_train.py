"""`foretell train eagle3` on tiny models: the draft-vocabulary KL, training, resume, data-parallel equality,
a feature cache shared with a parallel-head run, evaluation, decoding with the trained head, the CLI."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import PROMPTS, accepted_drafts, greedy_params, make_tokenizer
from foretell.api import load
from foretell.cli import main
from foretell.config import EagleTreeShape
from foretell.drafters.eagle_tree import Eagle3Drafter
from foretell.errors import ForetellError
from foretell.models.eagle3 import new_eagle3_head
from foretell.models.eagle3_format import load_eagle3_head
from foretell.runtime.loading import build_model
from foretell.train.common.data import TokenData
from foretell.train.common.draft_vocab import draft_vocab_kl, draft_vocabulary
from foretell.train.common.topk import full_kl
from foretell.train.eagle3.eval import eagle3_depth_eval
from foretell.train.eagle3.loss import Eagle3LossConfig
from foretell.train.eagle3.pipeline import Eagle3Shape, Eagle3TrainConfig, run_eagle3
from train_util import (
    VOCAB, assert_resume_repeats_the_run, assert_two_processes_train_like_one, assert_loss_fell, read_log,
    run_fields, tiny_setup, trained_run,
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_setup(tmp_path_factory, "train_eagle3", layers=4)


def config(setup, out: Path, **train) -> Eagle3TrainConfig:
    return Eagle3TrainConfig(**run_fields(setup, out, **train), shape=Eagle3Shape(draft_vocab=40),
                             loss=Eagle3LossConfig(ttt_steps=3, anchors=8))


@pytest.fixture(scope="module")
def trained(setup):
    return trained_run(run_eagle3, config, setup)


# --- the loss ------------------------------------------------------------------------------


def test_draft_vocab_kl_is_the_kl_to_the_target_restricted_to_the_draft_vocabulary():
    g = torch.Generator().manual_seed(0)
    p_logits, logits = torch.randn(5, 10, generator=g) * 2, torch.randn(5, 6, generator=g)
    inside = torch.tensor([0, 2, 3, 5, 7, 8])  # draft column j holds target id inside[j]
    column = torch.full((10,), -1)
    column[inside] = torch.arange(6)
    logp = torch.log_softmax(p_logits, -1)
    top, ids = logp.topk(10, -1)  # k = V: no tail
    restricted = torch.log_softmax(p_logits[:, inside], -1)  # p renormalised on the draft vocabulary
    torch.testing.assert_close(draft_vocab_kl(logits, top, column[ids]), full_kl(restricted, logits))
    # Everything outside: finite value and gradient (the pair is masked out of the loss anyway).
    logits.requires_grad_(True)
    value = draft_vocab_kl(logits, top[:, :2], torch.full((5, 2), -1)).sum()
    value.backward()
    assert torch.isfinite(value) and bool(torch.isfinite(logits.grad).all())


def test_draft_vocabulary_counts_the_drafted_tokens():
    ids = torch.tensor([[1, 5, 5, 7, 9, 9, 9, 2]])
    mask = torch.tensor([[False, True, True, True, True, True, False, False]])
    vocab = draft_vocabulary(TokenData(ids, mask), 3, 12, special_ids=(2,))
    assert vocab.tolist() == [2, 5, 9]  # drafted: 5, 7, 9, 9, 9, 2 (after masked rows 1..5); 2 is special


# --- training ------------------------------------------------------------------------------


def test_loss_decreases_and_only_the_head_trains(trained):
    cfg, head_dir = trained
    assert_loss_fell(cfg.out)
    saved = load_file(str(head_dir / "model.safetensors"))
    assert {k.split(".")[0] for k in saved} == {"fc", "midlayer", "norm", "lm_head", "d2t", "t2d"}  # no embedding
    target = build_model(Path(cfg.target), torch.float32)
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    vocab = draft_vocabulary(data, 40, VOCAB, make_tokenizer(VOCAB).all_special_ids)
    assert torch.equal(torch.arange(40) + saved["d2t"], vocab)  # the training data's most drafted tokens
    assert torch.equal(target.embed_tokens.weight, load_file(str(Path(cfg.target) / "model.safetensors"))["model.embed_tokens.weight"])
    head = load_eagle3_head(head_dir, target)
    assert head.config.aux_layers == (1, 2, 3)


def test_resumed_run_matches_an_uninterrupted_one(setup, tmp_path):
    assert_resume_repeats_the_run(run_eagle3, lambda out: config(setup, out), tmp_path, "head")
    with pytest.raises(ForetellError, match="other settings \\(--lr was 0.003, now 0.01\\); rerun with --no-resume"):
        run_eagle3(config(setup, tmp_path / "split", lr=1e-2))


def test_two_processes_match_one_with_the_same_global_batch(setup, tmp_path):
    a = assert_two_processes_train_like_one(run_eagle3, lambda out: config(setup, out, steps=3), tmp_path, "head")
    target = build_model(Path(setup[1]), torch.float32)
    one = tmp_path / "one" / "head"
    start = new_eagle3_head(target, load_eagle3_head(one, target).config, draft_vocab=torch.arange(40) + a["d2t"]).state_dict()
    assert all(not torch.equal(a[k], start[k]) for k in ("fc.weight", "lm_head.weight")), "three steps trained it"
    # The sharded feature pass (each process its own rows) wrote the same cache.
    for name in ("features", "logp", "ids"):
        x, y = (np.load(tmp_path / run / "features" / f"{name}.npy") for run in ("one", "two"))
        assert np.array_equal(x, y) if name == "ids" else np.allclose(x.astype(np.float32), y.astype(np.float32), atol=2)
    assert [r["step"] for r in read_log(tmp_path / "two")] == [1, 2, 3]  # one log, written by the main process


def test_an_eagle3_run_reuses_a_parallel_head_runs_features(setup, tmp_path):
    """Same data and layers: the EAGLE-3 run trains on the parallel-head run's cache, no feature pass."""
    from foretell.train.parallel_head.pipeline import HeadShape, ParallelHeadTrainConfig, run_parallel_head
    from foretell.train.parallel_head.train import HeadLossConfig

    base = config(setup, tmp_path / "eagle3")
    head_cfg = ParallelHeadTrainConfig(target=base.target, out=tmp_path / "head", data=base.data, eval_sequences=0,
                                       shape=HeadShape(depth=2, fuse_layers=(1, 2, 3)), loss=HeadLossConfig(anchors=4),
                                       features=base.features, train=replace(base.train, steps=1))
    run_parallel_head(head_cfg)
    (tmp_path / "eagle3").mkdir()
    for part in ("data", "features"):
        os.symlink(tmp_path / "head" / part, tmp_path / "eagle3" / part)
    before = (tmp_path / "head" / "features" / "features.npy").stat().st_mtime_ns
    run_eagle3(replace(base, train=replace(base.train, steps=2)))
    assert (tmp_path / "head" / "features" / "features.npy").stat().st_mtime_ns == before
    assert (tmp_path / "eagle3" / "head" / "model.safetensors").is_file()


def test_features_from_reads_another_runs_data_and_cache_and_its_layers(setup, tmp_path):
    """--features-from RUN: no feature pass and nothing written in RUN; the aux layers default to the cache's (the
    parallel head's, not EAGLE-3's own default); a run whose data or layers differ is refused naming the option."""
    from foretell.train.common.data import DataConfig
    from foretell.train.parallel_head.pipeline import HeadShape, ParallelHeadTrainConfig, run_parallel_head
    from foretell.train.parallel_head.train import HeadLossConfig

    base = config(setup, tmp_path / "eagle3", steps=2)
    head_run = tmp_path / "head"
    run_parallel_head(ParallelHeadTrainConfig(
        target=base.target, out=head_run, data=base.data, eval_sequences=0, shape=HeadShape(depth=2, fuse_layers=(0, 2, 4)),
        loss=HeadLossConfig(anchors=4), features=base.features, train=replace(base.train, steps=1)))
    stamps = {f: f.stat().st_mtime_ns for f in head_run.rglob("*") if f.is_file() and "train" not in f.parts}
    head = run_eagle3(replace(base, features_from=head_run))
    assert load_eagle3_head(head, build_model(Path(setup[1]), torch.float32)).config.aux_layers == (0, 2, 4)
    assert not (tmp_path / "eagle3" / "features").exists() and not (tmp_path / "eagle3" / "data").exists()
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps
    refused = [
        (replace(base, out=tmp_path / "a", features_from=head_run, shape=Eagle3Shape(40, (1, 2, 3))),
         "--aux-layers was \\[0, 2, 4\\], now \\[1, 2, 3\\]"),
        (replace(base, out=tmp_path / "b", features_from=head_run, data=DataConfig(base.data.source, seq_len=24)),
         "--seq-len was 32, now 24"),
        (replace(base, out=tmp_path / "c", features_from=tmp_path / "nothing"), "holds no finished data and feature cache"),
    ]
    for cfg, message in refused:
        with pytest.raises(ForetellError, match=f"--features-from .*{message}"):
            run_eagle3(cfg)
        assert not cfg.out.exists()
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps


# --- evaluation and use --------------------------------------------------------------------


def test_eval_is_in_range_and_beats_an_untrained_head(trained):
    cfg, head_dir = trained
    result = json.loads((cfg.out / "eval.json").read_text())
    assert result["depth"] == [1, 2, 3, 4, 5] and result["sequences"] == 12
    for key in ("top1", "expected_acceptance", "chain_top1"):
        assert all(0.0 <= v <= 1.0 for v in result[key])
    assert 0.5 < result["draft_vocab_coverage"] <= 1.0
    target = build_model(Path(cfg.target), torch.float32)
    head = load_eagle3_head(head_dir, target)
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    data = TokenData(data.input_ids[:12], data.loss_mask[:12])
    untrained = new_eagle3_head(target, head.config, draft_vocab=head.vocab_ids)
    assert eagle3_depth_eval(target, head, data, 3)["top1"][0] > eagle3_depth_eval(target, untrained, data, 3)["top1"][0]


def test_trained_head_decodes_exactly_and_gets_accepted(trained):
    cfg, head_dir = trained
    plain = load(cfg.target, "none", warm_up=False)
    target = plain.target.model
    head = load_eagle3_head(head_dir, target)
    untrained = new_eagle3_head(target, head.config, draft_vocab=head.vocab_ids)
    shape = EagleTreeShape(depth=4, width=3, max_nodes=12)
    prompts = [plain.encode(json.loads(line)["question"]) for line in Path(cfg.eval_data).read_text().splitlines()[:4]]
    good = accepted_drafts(plain, Eagle3Drafter(head, shape), prompts + PROMPTS[:2])
    bad = accepted_drafts(plain, Eagle3Drafter(untrained, shape), prompts + PROMPTS[:2])
    assert good > bad


def test_cli_end_to_end(setup, tmp_path, capsys):
    root, target, data, held_out = setup
    out = tmp_path / "cli"
    assert main(["train", "eagle3", "--target", str(target), "--data", str(data), "--eval-data", str(held_out),
                 "--seq-len", "32", "--steps", "2", "--batch-size", "2", "--eval-sequences", "2", "--draft-vocab", "40",
                 "--ttt-steps", "2", "--anchors", "4", "--out", str(out)]) == 0
    assert f"head: {out / 'head'}" in capsys.readouterr().out
    assert main(["export", "eagle3", "--head", str(out), "--target", str(target), "--out", str(tmp_path / "x")]) == 0
    assert json.loads((tmp_path / "x" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    # the run's folder names the head it saved (as README's --head runs/head does)
    assert main(["generate", "--model", str(target), "--eagle", str(out), "w5 w9", "--max-new-tokens", "5"]) == 0
    assert main(["train", "eagle3", "--target", str(target), "--data", str(data), "--out", str(out),
                 "--aux-layers", "1,x"]) == 2
    assert "--aux-layers takes comma-separated layer numbers" in capsys.readouterr().err


def test_greedy_with_the_trained_head_from_the_configuration(trained):
    cfg, head_dir = trained
    plain = load(cfg.target, "none", warm_up=False)
    spec = plain.with_speculative({"method": "eagle3", "model": str(head_dir)})
    for prompt in PROMPTS:
        assert spec.engine.generate(prompt, greedy_params()).tokens == plain.engine.generate(prompt, greedy_params()).tokens


def test_torchrun_trains_data_parallel_like_one_process(setup, tmp_path):
    """The command under torchrun (2 processes, gloo, ranks from the environment) == the same command alone."""
    import subprocess
    import sys

    from foretell.train.common.distributed import free_port

    root, target, data, held_out = setup
    args = ["train", "eagle3", "--target", str(target), "--data", str(data), "--seq-len", "32", "--steps", "3",
            "--batch-size", "4", "--eval-sequences", "0", "--draft-vocab", "40", "--anchors", "4", "--threads", "1"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(free_port()), "-m", "foretell.cli", *args, "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("head: ") == 1  # printed by the main process only
    a = load_file(str(tmp_path / "one" / "head" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "head" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)
