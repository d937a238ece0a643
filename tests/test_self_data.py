"""Self-distillation data: the answers are the engine's own greedy output, whatever the drafter and batch, and the
file resumes."""

from __future__ import annotations

import json

import pytest

from conftest import make_hf_model, make_tokenizer, save_model_folder
from foretell.api import load
from foretell.cli import main
from foretell.config import SpeculativeConfig
from foretell.errors import ForetellError
from foretell.train.common.self_data import SelfDataConfig, done_count, make_self_data
from foretell.types import SamplingParams

VOCAB = 48


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("self_data")
    return save_model_folder(root / "target", make_hf_model("llama", VOCAB, seed=0, layers=2), make_tokenizer(VOCAB))


def write_prompts(path, count: int):
    with open(path, "w") as f:
        for i in range(count):
            words = " ".join(f"w{3 + (i * 7 + j * 5) % 40}" for j in range(2 + i % 5))  # prompts of several lengths
            f.write(json.dumps({"question": words, "answer": "w1"}) + "\n")
    return path


def answers(path) -> list[str]:
    return [json.loads(x)["messages"][1]["content"] for x in path.read_text().splitlines()]


def test_answers_are_the_targets_own_greedy_output(target, tmp_path):
    """Batched and drafted (prompt lookup, none), the rows hold exactly what plain decoding of each prompt alone
    writes, in prompt order."""
    data = write_prompts(tmp_path / "prompts.jsonl", 7)
    plain = load(target, "none", warm_up=False)
    files = {}
    for name, spec in {"lookup": SpeculativeConfig(method="prompt-lookup"), "none": SpeculativeConfig()}.items():
        cfg = SelfDataConfig(str(target), str(data), num_prompts=7, max_new_tokens=20, batch_size=3, dtype="float32",
                             speculative=spec)
        files[name] = make_self_data(cfg, tmp_path / f"{name}.jsonl")
    rows = [json.loads(x)["messages"] for x in files["lookup"].read_text().splitlines()]
    expected = []
    for messages in rows:
        ids = plain.encode([messages[0]])
        tokens = plain.engine.generate(ids, SamplingParams(max_new_tokens=20)).tokens
        expected.append(plain.tokenizer.decode(tokens, skip_special_tokens=True))
    assert answers(files["lookup"]) == expected == answers(files["none"])
    assert len(set(expected)) > 1  # distinct prompts, distinct answers: an order mix-up would show


def test_sampled_answers_do_not_depend_on_the_batch(target, tmp_path):
    """At temperature > 0 prompt i samples with seed + i: the same file whatever the batch size."""
    data = write_prompts(tmp_path / "prompts.jsonl", 5)
    files = [make_self_data(SelfDataConfig(str(target), str(data), num_prompts=5, max_new_tokens=12, temperature=1.0,
                                           batch_size=size, dtype="float32", seed=3), tmp_path / f"b{size}.jsonl")
             for size in (1, 4)]
    assert answers(files[0]) == answers(files[1])


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
    args = ["self-data", "--target", str(target), "--drafter", "parallel-head", "--head", str(tmp_path / "h"),
            "--lossy-threshold", "0.5", "--out", str(tmp_path / "x.jsonl")]
    assert main(args) == 2
    assert "leave --lossy-threshold off" in capsys.readouterr().err
    with pytest.raises(ForetellError, match="LOSSY"):
        SelfDataConfig(speculative=SpeculativeConfig(method="parallel-head", model="h", lossy_threshold=0.5))
