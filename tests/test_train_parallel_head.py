"""`foretell train parallel-head` on tiny models: anchors, loss, resume, per-depth eval, loading, CLI."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from foretell.api import load
from foretell.cli import main
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.models.parallel_head import ParallelHeadConfig, load_parallel_head, new_parallel_head
from foretell.runtime.loading import build_model
from foretell.train.common.data import TokenData
from foretell.train.common.depths import anchor_candidates, sample_anchors, valid_depths
from foretell.train.common.features import FeatureCache
from foretell.train.parallel_head.eval import depth_acceptance
from foretell.train.parallel_head.pipeline import HeadShape, ParallelHeadTrainConfig, run_parallel_head
from foretell.train.parallel_head.train import HeadLossConfig
from foretell.types import SamplingParams
from train_util import (
    SEQ_LEN, assert_resume_repeats_the_run, assert_two_processes_train_like_one, assert_loss_fell, read_log, run_fields,
    tiny_setup, trained_run,
)

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_setup(tmp_path_factory, "train_head", layers=3)


def config(setup, out: Path, **train) -> ParallelHeadTrainConfig:
    return ParallelHeadTrainConfig(**run_fields(setup, out, **train), shape=HeadShape(depth=4),
                                   loss=HeadLossConfig(anchors=8))


@pytest.fixture(scope="module")
def trained(setup):
    return trained_run(run_parallel_head, config, setup)


# --- anchors -------------------------------------------------------------------------------


def test_anchors_and_valid_depths_by_hand():
    mask = torch.tensor([False, False, True, True, True, False, False])  # tokens 3, 4, 5 are trained
    assert anchor_candidates(mask).tolist() == [1, 2, 3]  # depth 1 of anchor a is token a + 2
    assert valid_depths(mask, torch.tensor([1, 3]), 3).tolist() == [[True, True, True], [True, False, False]]
    picked = sample_anchors(torch.ones(40, dtype=torch.bool), 5, seed=3)
    assert picked.tolist() == sorted(set(picked.tolist())) and len(picked) == 5
    assert torch.equal(picked, sample_anchors(torch.ones(40, dtype=torch.bool), 5, seed=3))


# --- training ------------------------------------------------------------------------------


def test_features_are_the_targets_hidden_states_and_distributions(trained):
    cfg, _ = trained
    cache = FeatureCache.open(cfg.out / "features")
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    target = build_model(Path(cfg.target), torch.float32)
    layers = ParallelHeadConfig.for_target(target.config).fuse_layers
    out = target.forward_sequences(data.input_ids[:2], hidden_layers=layers)
    for i in range(2):
        features, logp, ids = cache.sequence(i)
        expected = torch.cat([out.hidden[layer][i] for layer in layers], -1)
        torch.testing.assert_close(features.float(), expected, atol=0.05, rtol=0.01)  # bf16 storage
        assert torch.equal(ids[:, 0], out.logits[i].argmax(-1))
        torch.testing.assert_close(logp[:, 0], torch.log_softmax(out.logits[i], -1).max(-1).values)


def test_loss_decreases(trained):
    cfg, _ = trained
    assert_loss_fell(cfg.out)
    assert (cfg.out / "train" / "loss.png").stat().st_size > 0


def test_only_the_head_trains(trained):
    cfg, head_dir = trained
    target = build_model(Path(cfg.target), torch.float32)
    reference = load_file(str(Path(cfg.target) / "model.safetensors"))
    assert torch.equal(target.embed_tokens.weight, reference["model.embed_tokens.weight"])
    saved = load_file(str(head_dir / "model.safetensors"))
    assert {k.split(".")[0] for k in saved} == {"fuse", "mask_embedding", "layers", "norm"}
    untrained = new_parallel_head(target, load_parallel_head(head_dir, target).config, seed=cfg.train.seed).state_dict()
    assert all(not torch.equal(saved[k], untrained[k]) for k in ("fuse.weight", "mask_embedding"))


def test_resumed_run_matches_an_uninterrupted_one(setup, tmp_path, capsys):
    assert_resume_repeats_the_run(run_parallel_head, lambda out: config(setup, out), tmp_path, "head")
    assert [r["step"] for r in read_log(tmp_path / "split")] == [1, 2, 3, 4, 5, 6]
    said = capsys.readouterr().out
    checkpoint = tmp_path / "split" / "train" / "checkpoint.pt"
    assert said.count("resuming") == 1  # the rerun says it continues, and from where; the first runs do not
    assert f"resuming parallel head from its checkpoint {checkpoint} at step 3 of 6" in said
    # Other settings in the same folder are refused rather than mixed into the run.
    with pytest.raises(ForetellError, match="other settings \\(--lr was 0.003, now 0.01\\); rerun with --no-resume"):
        run_parallel_head(config(setup, tmp_path / "split", lr=1e-2))


# --- evaluation and use --------------------------------------------------------------------


def test_per_depth_eval_is_in_range_and_beats_an_untrained_head(trained):
    cfg, head_dir = trained
    result = json.loads((cfg.out / "eval.json").read_text())
    assert result["depth"] == [1, 2, 3, 4] and result["sequences"] == 12
    for key in ("top1", "expected_acceptance", "chain_top1"):
        assert len(result[key]) == 4 and all(0.0 <= v <= 1.0 for v in result[key])
    assert all(c <= t + 1e-9 for c, t in zip(result["chain_top1"], result["top1"]))
    assert all(n > 0 for n in result["anchors"])
    target = build_model(Path(cfg.target), torch.float32)
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    data = TokenData(data.input_ids[:12], data.loss_mask[:12])
    trained_eval = depth_acceptance(target, load_parallel_head(head_dir, target), data)
    untrained_eval = depth_acceptance(target, new_parallel_head(target, load_parallel_head(head_dir, target).config), data)
    assert trained_eval["top1"][0] > untrained_eval["top1"][0]
    assert trained_eval["expected_acceptance"][0] > untrained_eval["expected_acceptance"][0]


def test_trained_head_decodes_exactly_like_plain_greedy(trained):
    cfg, head_dir = trained
    spec = load(cfg.target, SpeculativeConfig(method='parallel-head', model=str(head_dir)), warm_up=False)
    plain = load(cfg.target, "none", warm_up=False)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    accepted = 0
    for prompt in ([1, 5, 9, 12, 5, 9, 30], [1, 20, 21, 22, 23], [1, 7, 3]):
        result = spec.engine.generate(prompt, params)
        assert result.tokens == plain.engine.generate(prompt, params).tokens
        accepted += sum(result.stats.accepted_per_position)
    assert accepted > 0


# --- command line --------------------------------------------------------------------------


def test_cli_end_to_end(setup, tmp_path, capsys):
    root, target, data, held_out = setup
    out = tmp_path / "cli"
    argv = ["train", "parallel-head", "--target", str(target), "--data", str(data), "--eval-data", str(held_out),
            "--seq-len", str(SEQ_LEN), "--steps", "4", "--batch-size", "2", "--anchors", "4", "--depth", "2",
            "--fuse-layers", "0,3", "--depth-decay", "0.5", "--topk-teacher", "8", "--eval-sequences", "4",
            "--checkpoint-every", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| depth |" in printed and f"head: {out / 'head'}" in printed
    assert json.loads((out / "eval.json").read_text())["depth"] == [1, 2]
    assert load_parallel_head(out / "head", build_model(target, torch.float32)).config.fuse_layers == (0, 3)
    assert main(argv) == 0  # a finished run is skipped, and evaluated again
    assert "already trained" in capsys.readouterr().out
    # README's `--head runs/head` after `train parallel-head --out runs/head`: the run's folder names its head
    assert main(["generate", "--model", str(target), "--head", str(out), "w5 w9", "--max-new-tokens", "5",
                 "--tree-depth", "2"]) == 0
    assert main(["generate", "--model", str(target), "--head", str(tmp_path), "w5 w9"]) == 2
    assert "saves it in OUT/head" in capsys.readouterr().err


def test_cli_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["train", "parallel-head", "--help"])
    text = capsys.readouterr().out
    for option in ("--data", "--eval-data", "--depth", "--fuse-layers", "--anchors", "--depth-decay", "--steps",
                   "--checkpoint-every", "--resume", "--out"):
        assert option in text


def test_cli_errors_are_one_line(setup, tmp_path, capsys):
    root, target, data, _ = setup
    base = ["train", "parallel-head", "--target", str(target), "--seq-len", str(SEQ_LEN), "--out", str(tmp_path / "e")]
    cases = [
        (["--data", str(tmp_path / "missing.jsonl")], f"no data file {tmp_path / 'missing.jsonl'} (--data): it does not exist"),
        (["--data", "nosuch"], "no data file nosuch (--data): it is neither gsm8k, sharegpt, both nor an existing .jsonl"),
        (["--data", str(data), "--eval-data", str(tmp_path / "gone.jsonl")], "(--eval-data): it does not exist"),
        (["--data", str(data), "--depth-decay", "1.5"], "--depth-decay must be in (0, 1]"),
        (["--data", str(data), "--steps", "0"], "--steps must be >= 1"),
        (["--data", str(data), "--fuse-layers", "1,x"], "comma-separated"),
        (["--data", str(data), "--fuse-layers", "1,9", "--eval-sequences", "0"], "fuse_layers must be distinct"),
        (["--data", str(data), "--lr", "-1"], "--lr must be > 0"),
    ]
    for extra, message in cases:
        assert main(base + extra) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].startswith("foretell: error:") and message in lines[-1], lines
    assert not (tmp_path / "e").exists()  # each was refused before anything was written


def files_of(folder: Path) -> dict[Path, tuple[bytes, int]]:
    return {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in folder.rglob("*") if f.is_file()}


def test_a_changed_setting_is_refused_before_any_write_naming_the_option(setup, tmp_path, capsys):
    """A rerun with other settings names each option that differs and the command that starts over, and leaves
    the folder as it was (the first command still resumes there); --no-resume then starts over, remaking the
    data and the feature cache."""
    import numpy as np

    root, target, data, _ = setup
    out = tmp_path / "run"
    base = ["train", "parallel-head", "--target", str(target), "--data", str(data), "--eval-sequences", "0",
            "--batch-size", "2", "--anchors", "4", "--depth", "2", "--topk-teacher", "8", "--checkpoint-every", "2",
            "--out", str(out)]
    first = base + ["--seq-len", str(SEQ_LEN), "--steps", "2"]
    assert main(first) == 0
    before = files_of(out)
    cases = [
        (["--seq-len", str(SEQ_LEN), "--steps", "4"], "--steps was 2, now 4"),
        (["--seq-len", "24", "--steps", "2"], f"--seq-len was {SEQ_LEN}, now 24"),
        (["--seq-len", str(SEQ_LEN), "--steps", "2", "--topk-teacher", "4"], "--topk-teacher was 8, now 4"),
        (["--seq-len", str(SEQ_LEN), "--steps", "2", "--fuse-layers", "0,3"], "--fuse-layers was [1, 2], now [0, 3]"),
    ]
    capsys.readouterr()
    for extra, named in cases:
        assert main(base + extra) == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert named in error and "rerun with --no-resume to start over there" in error, error
        assert files_of(out) == before  # nothing written, nothing touched
    assert main(first) == 0 and "already trained" in capsys.readouterr().out
    capsys.readouterr()
    assert main(base + ["--seq-len", "24", "--steps", "2", "--no-resume"]) == 0
    said = " ".join(capsys.readouterr().out.split())  # what --no-resume replaces, said before it does
    assert f"--no-resume: the earlier run's finished training (2 steps) in {out / 'train'} is removed" in said
    assert f"--no-resume: the head saved earlier in {out / 'head'} is replaced when this run finishes" in said
    assert json.loads((out / "data" / "data.json").read_text())["seq_len"] == 24
    assert np.load(out / "features" / "features.npy", mmap_mode="r").shape[1] == 24
    assert json.loads((out / "train" / "job.json").read_text())["data"]["seq_len"] == 24
    capsys.readouterr()
    assert main(first) == 2 and f"--seq-len was 24, now {SEQ_LEN}" in capsys.readouterr().err


def test_a_failed_check_writes_nothing_and_leaves_the_folder_reusable(setup, trained, tmp_path):
    """Warm starts that cannot be used are refused before the data step: the folder stays empty and the right
    command then runs in it."""
    from safetensors.torch import save_file

    _, head_dir = trained
    damaged = tmp_path / "damaged"
    shutil.copytree(head_dir, damaged)
    state = load_file(str(damaged / "model.safetensors"))
    state["fuse.weight"][0, 0] = float("nan")
    save_file(state, str(damaged / "model.safetensors"))
    out = tmp_path / "run"
    with pytest.raises(ForetellError, match="holds NaN or infinite values"):
        run_parallel_head(replace(config(setup, out, steps=1), init_head=damaged))
    with pytest.raises(ForetellError, match="another shape"):
        run_parallel_head(replace(config(setup, out, steps=1), shape=HeadShape(depth=2), init_head=head_dir))
    assert not out.exists()
    assert (run_parallel_head(replace(config(setup, out, steps=1), init_head=head_dir)) / "model.safetensors").is_file()


def test_an_interrupted_feature_pass_continues_where_it_stopped(trained, tmp_path):
    import shutil

    import numpy as np

    from foretell.train.common.cache import read_meta, write_meta
    from foretell.train.common.features import FeatureConfig, build_feature_cache

    cfg, _ = trained
    folder = tmp_path / "features"
    shutil.copytree(cfg.out / "features", folder)
    before = FeatureCache.open(folder)
    expected = [before.sequence(i) for i in range(len(before.features))]
    meta = read_meta(folder)
    write_meta(folder, {**meta, "done": 8})  # as if stopped after 8 sequences, the rest never written
    for name in ("features", "logp", "ids"):
        array = np.load(folder / f"{name}.npy", mmap_mode="r+")
        array[8:] = 0
        array.flush()
    target = build_model(Path(cfg.target), torch.float32)
    layers = tuple(meta["fuse_layers"])
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    after = build_feature_cache(target, data, layers, folder, FeatureConfig(top_k=meta["top_k"]), meta["fingerprint"])
    for i, rows in enumerate(expected):
        assert all(torch.equal(a, b) for a, b in zip(rows, after.sequence(i)))
    with pytest.raises(ForetellError, match="another target, data or head"):
        build_feature_cache(target, data, layers[:1], folder, FeatureConfig(top_k=meta["top_k"]), meta["fingerprint"])


def test_init_head_continues_from_a_trained_head(setup, trained, tmp_path):
    """--init-head: training starts from the given head (not a random one), and a head of another shape is refused."""
    _, head_dir = trained
    cfg = replace(config(setup, tmp_path / "more", steps=1, lr=1e-9, warmup_steps=0), init_head=head_dir)
    more = run_parallel_head(cfg)
    start, after = load_file(str(head_dir / "model.safetensors")), load_file(str(more / "model.safetensors"))
    assert all(torch.allclose(start[k], after[k], atol=1e-5) for k in start)  # a near-zero step from the trained weights
    job = json.loads((tmp_path / "more" / "train" / "job.json").read_text())
    assert job["init_head"] == str(head_dir)
    with pytest.raises(ForetellError, match="another shape .*depth"):
        run_parallel_head(replace(config(setup, tmp_path / "other"), shape=HeadShape(depth=2), init_head=head_dir))
    with pytest.raises(ForetellError, match="no parallel_head.json"):
        run_parallel_head(replace(config(setup, tmp_path / "none"), init_head=tmp_path))


def test_two_processes_match_one_with_the_same_global_batch(setup, tmp_path):
    """Data-parallel (2 gloo processes, a sharded feature pass) == 1 process at the same global batch."""
    a = assert_two_processes_train_like_one(run_parallel_head, lambda out: config(setup, out, steps=3), tmp_path, "head")
    target = build_model(Path(setup[1]), torch.float32)
    start = new_parallel_head(target, load_parallel_head(tmp_path / "one" / "head", target).config).state_dict()
    assert not torch.equal(a["fuse.weight"], start["fuse.weight"]), "three steps trained it"
    log, first = read_log(tmp_path / "two"), read_log(tmp_path / "one")
    assert [r["anchors"] for r in log] == [r["anchors"] for r in first]  # statistics summed over the processes
    assert [round(r["loss"], 4) for r in log] == [round(r["loss"], 4) for r in first]


# --- a head trained on its own vocabulary ---------------------------------------------------


def test_a_draft_vocabulary_head_saves_its_ids_trains_on_them_and_decodes_exactly(setup, tmp_path):
    from foretell.hot_vocab import HotVocab
    from foretell.train.common.draft_vocab import draft_vocabulary

    cfg = replace(config(setup, tmp_path / "vocab", steps=40), shape=HeadShape(depth=4, draft_vocab=20))
    head_dir = run_parallel_head(cfg)
    target = build_model(Path(cfg.target), torch.float32)
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    vocab = draft_vocabulary(data, 20, target.config.vocab_size, [0, 1, 2])
    head = load_parallel_head(head_dir, target)
    assert head.config.draft_vocab_size == 20 and torch.equal(head.vocab_ids.cpu(), vocab)
    assert torch.equal(load_file(str(head_dir / "model.safetensors"))["draft_vocab_ids"], vocab)
    # its logits: the head's vocabulary only, q = 0 elsewhere
    features = torch.randn(1, 6, len(head.config.fuse_layers) * target.config.hidden_size)
    full = head.forward_training(features, torch.tensor([[5, 6, 7, 8, 9, 10]]), [2, 4])
    assert full.shape[-1] == target.config.vocab_size and bool(torch.isinf(full[..., ~torch.isin(
        torch.arange(target.config.vocab_size), vocab)]).all())
    own = head.forward_training(features, torch.tensor([[5, 6, 7, 8, 9, 10]]), [2, 4], full_vocab=False)
    torch.testing.assert_close(own, full[..., vocab])
    # a load-time hot vocabulary narrows it to the ids in both
    narrowed = load_parallel_head(head_dir, target, hot=HotVocab(vocab[::2].clone(), target.config.vocab_size))
    assert torch.equal(narrowed.vocab_ids.cpu(), vocab[::2])
    # trained pairs: only where the target's top-1 is in the vocabulary, and the loss fell on them
    assert_loss_fell(cfg.out)
    spec = load(cfg.target, SpeculativeConfig(method="parallel-head", model=str(head_dir)), warm_up=False)
    plain = load(cfg.target, "none", warm_up=False)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    for prompt in ([1, 5, 9, 12, 5, 9, 30], [1, 20, 21, 22, 23]):
        assert spec.engine.generate(prompt, params).tokens == plain.engine.generate(prompt, params).tokens


def test_draft_vocabulary_pairs_are_those_whose_target_top1_it_holds(trained):
    from foretell.train.common.draft_vocab import columns_of, trained_pairs
    from foretell.train.parallel_head.train import sequence_terms

    cfg, head_dir = trained
    target = build_model(Path(cfg.target), torch.float32)
    cache = FeatureCache.open(cfg.out / "features")
    data = TokenData.load(cfg.out / "data" / "train.safetensors")
    anchors = anchor_candidates(data.loss_mask[0])[:6]
    full = new_parallel_head(target, load_parallel_head(head_dir, target).config)
    even = torch.arange(0, target.config.vocab_size, 2)
    config = replace(full.config, draft_vocab_size=len(even))
    half = new_parallel_head(target, config, draft_vocab=even)
    columns = columns_of(half.vocab_ids, config.vocab_size)
    kl, valid, _ = sequence_terms(half, cache, data, 0, anchors, columns)
    _, valid_full, _ = sequence_terms(full, cache, data, 0, anchors, None)
    ids = cache.sequence(0)[2][:, 0]
    at = (anchors[:, None] + torch.arange(1, 5)).clamp(max=len(ids) - 1)
    assert torch.equal(valid, valid_full & (ids[at] % 2 == 0))
    assert torch.equal(valid, trained_pairs(cache, data, 0, anchors, 4, columns))
    assert kl.shape == valid.shape and bool(torch.isfinite(kl).all())
    with pytest.raises(ForetellError, match="draft_vocab_size must be in 0..48"):
        replace(config, draft_vocab_size=49)
    with pytest.raises(ForetellError, match="4 distinct ascending target ids"):
        new_parallel_head(target, replace(config, draft_vocab_size=4), draft_vocab=torch.tensor([3, 2, 5, 9]))
