"""Self-distillation data: batched decoding equals one-at-a-time greedy, and the file resumes."""

from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import make_hf_model, make_tokenizer, save_model_folder
from foretell.cli import main
from foretell.models.loading import build_model
from foretell.train.common.self_data import done_count, generate_batch

VOCAB = 48


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("self_data")
    return save_model_folder(root / "target", make_hf_model("llama", VOCAB, seed=0, layers=2), make_tokenizer(VOCAB))


def greedy_one(model, prompt: list[int], max_new: int, stops: set[int]) -> list[int]:
    cache = model.new_cache(len(prompt) + max_new)
    logits = model(torch.tensor(prompt), torch.arange(len(prompt)), cache).logits[-1]
    cache.commit_prefix(len(prompt))
    out: list[int] = []
    for i in range(max_new):
        t = int(logits.argmax())
        out.append(t)
        if t in stops or i + 1 == max_new:
            return out
        logits = model(torch.tensor([t]), torch.tensor([len(prompt) + i]), cache).logits[-1]
        cache.commit_prefix(1)
    return out


def test_batched_decoding_equals_one_prompt_at_a_time(target):
    """Left padding, per-row positions and dropping finished rows must not change a row's tokens."""
    model = build_model(target, torch.float32)
    rng = random.Random(0)
    prompts = [[1] + [rng.randrange(3, VOCAB) for _ in range(n)] for n in (1, 9, 4, 15, 6)]
    stops = {5, 17}  # frequent enough that rows finish at different steps
    batched = generate_batch(model, prompts, 24, stops)
    single = [greedy_one(model, p, 24, stops) for p in prompts]
    assert batched == single
    assert len({len(o) for o in batched}) > 1, "no row finished early: the test would not exercise row dropping"


def test_cli_writes_rows_and_resumes_after_a_cut(target, tmp_path):
    data = tmp_path / "prompts.jsonl"
    with open(data, "w") as f:
        for i in range(6):
            f.write(json.dumps({"question": f"w{i + 3} w{i + 9}", "answer": "w1"}) + "\n")
    out = tmp_path / "answers.jsonl"
    args = ["self-data", "--target", str(target), "--data", str(data), "--num-prompts", "6", "--max-new-tokens", "8",
            "--batch-size", "4", "--dtype", "float32", "--out", str(out)]
    assert main(args) == 0
    full = out.read_text().splitlines()
    assert len(full) == 6
    rows = [json.loads(x)["messages"] for x in full]
    assert all([m["role"] for m in r] == ["user", "assistant"] for r in rows)
    assert rows[2][0]["content"] == "w5 w11"
    # A run killed mid-write: two whole rows and half a line. Rerunning finishes the same file.
    out.write_text("\n".join(full[:2]) + "\n" + full[2][:10])
    assert done_count(out) == 2
    assert main(args) == 0
    assert out.read_text().splitlines() == full


def test_bad_settings_are_named(target, tmp_path, capsys):
    assert main(["self-data", "--target", str(target), "--num-prompts", "0", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--num-prompts must be >= 1" in capsys.readouterr().err


def test_a_bf16_target_decodes_with_widened_linears(target, tmp_path, monkeypatch):
    """On a CPU without a native bf16 matmul the batch's passes must run widened (fp32), as the feature pass does:
    emulated bf16 made a Qwen2.5-Coder-1.5B batch several times slower."""
    import foretell.models.wide_linear as wide

    widened = []
    monkeypatch.setattr(wide, "widen_linears", lambda model, *a, **k: widened.append(model.dtype))
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"question": "w3 w9", "answer": "w1"}) + "\n")
    args = ["self-data", "--target", str(target), "--data", str(data), "--num-prompts", "1", "--max-new-tokens", "4",
            "--dtype", "bfloat16", "--out", str(tmp_path / "answers.jsonl")]
    assert main(args) == 0
    assert widened == [torch.bfloat16]
