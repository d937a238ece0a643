"""What the tests of the kinds trained on cached features share (parallel head, hidden state, EAGLE-3): a tiny
target with question / answer files, a short schedule, the run's log, and the checks every kind passes."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from conftest import make_hf_model, make_tokenizer, save_model_folder
from foretell.train.common.trainer import TrainConfig

VOCAB = 48
SEQ_LEN = 32


def write_dataset(path: Path, rows: int, seed: int) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            q = [rng.randrange(3, VOCAB - 3) for _ in range(rng.randrange(2, 6))]
            answer = " ".join(f"w{(i * 7) % 45}" for i in q + q[::-1])
            f.write(json.dumps({"question": " ".join(f"w{i}" for i in q), "answer": answer}) + "\n")
    return path


def tiny_setup(tmp_path_factory, name: str, layers: int) -> tuple[Path, Path, Path, Path]:
    """(root, target folder, training file, held-out file): a tiny Llama target of `layers` layers."""
    root = tmp_path_factory.mktemp(name)
    target = save_model_folder(root / "target", make_hf_model("llama", VOCAB, seed=0, layers=layers), make_tokenizer(VOCAB))
    return root, target, write_dataset(root / "train.jsonl", 48, 0), write_dataset(root / "test.jsonl", 12, 1)


def short_train(**train) -> TrainConfig:
    """6 steps of 4 sequences, one per micro batch, checkpointed every 2 steps; `train` overrides."""
    return TrainConfig(**{"steps": 6, "batch_size": 4, "micro_batch_size": 1, "lr": 3e-3, "checkpoint_every": 2, **train})


def read_log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "train" / "log.jsonl").read_text().splitlines()]


def mean_losses(log: list[dict], rows: int = 5) -> tuple[float, float]:
    """The mean loss of the first and of the last `rows` log rows."""
    return sum(r["loss"] for r in log[:rows]) / rows, sum(r["loss"] for r in log[-rows:]) / rows


def assert_loss_fell(out: Path, steps: int = 40) -> None:
    """The run in `out` logged each of its `steps` steps, and the loss of its last 5 fell below 0.7 times its
    first 5's."""
    log = read_log(out)
    assert [r["step"] for r in log] == list(range(1, steps + 1))
    first, last = mean_losses(log)
    assert last < 0.7 * first, (first, last)


def assert_resume_repeats_the_run(run, make_config, tmp_path: Path, what: str) -> None:
    """A run stopped after 3 steps and run again ends with the weights of an uninterrupted one. run(cfg) -> the
    folder of the trained module, OUT/<what>; make_config(out) -> the run's config."""
    whole = run(make_config(tmp_path / "whole"))
    split_cfg = make_config(tmp_path / "split")
    run(replace(split_cfg, stop_after=3))
    assert not (tmp_path / "split" / what).exists()
    split = run(split_cfg)
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(split / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def assert_two_processes_train_like_one(run, make_config, tmp_path: Path, what: str) -> dict:
    """2 gloo processes (a sharded feature pass) train the weights 1 process does at the same global batch,
    in OUT/one and OUT/two; returns those weights."""
    from foretell.train.common.distributed import call_with_context, launch

    one = run(make_config(tmp_path / "one"))
    launch(call_with_context, (run, make_config(tmp_path / "two")), 2, threads=1)
    a, b = load_file(str(one / "model.safetensors")), load_file(str(tmp_path / "two" / what / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)
    return a


def run_fields(setup, out: Path, **train) -> dict:
    """The fields every kind's run config takes, for a run in `out` on `setup` (tiny_setup's) with no held-out
    evaluation and short_train(**train)."""
    from foretell.train.common.data import DataConfig

    root, target, data, held_out = setup
    return dict(target=str(target), out=out, data=DataConfig(str(data), seq_len=SEQ_LEN), eval_data=str(held_out),
                eval_sequences=0, train=short_train(**train))


def trained_run(run, config, setup, **train) -> tuple:
    """(config, the trained module's folder) of a run of 40 steps (4 of warmup) in ROOT/trained, evaluated on 12
    held-out sequences. config(setup, out, **train) -> the kind's run config."""
    cfg = replace(config(setup, setup[0] / "trained", **{"steps": 40, "warmup_steps": 4, **train}), eval_sequences=12)
    return cfg, run(cfg)
