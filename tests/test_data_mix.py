"""Training data from several sources, and evaluation prompts kept out of it (train/common/heldout.py)."""

from __future__ import annotations

import json

import pytest

from conftest import make_tokenizer
from foretell.errors import ForetellError
from foretell.train.common.data import DataConfig, DataReport, build_token_data, parse_sources
from foretell.train.common.heldout import HeldOut

VOCAB = 48


def test_parse_sources():
    assert parse_sources("gsm8k", None) == [("gsm8k", None)]
    assert parse_sources("both", 7) == [("gsm8k", 4), ("sharegpt", 3)]  # half each, the first takes the remainder
    assert parse_sources("a.jsonl,sharegpt:300,gsm8k", 10) == [("a.jsonl", 5), ("sharegpt", 300), ("gsm8k", 5)]
    assert parse_sources("a.jsonl , b.jsonl:2", None) == [("a.jsonl", None), ("b.jsonl", 2)]
    with pytest.raises(ForetellError, match="count must be >= 1"):
        parse_sources("gsm8k:0", None)
    with pytest.raises(ForetellError, match="no data source"):
        parse_sources(" , ", None)


def test_heldout_index_finds_copies_however_formatted():
    index = HeldOut.of(["Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
                        "Who wrote the Iliad?", "Hi there"])
    assert index.prompts == 2  # "Hi there" is too short to hold out
    assert index.overlaps("Q: NATALIA sold clips to 48 of her friends in april -- and then she sold half")
    assert index.overlaps("tell me: who wrote the iliad? thanks")  # a short prompt: the whole of it
    assert not index.overlaps("Natalia sold clips to 48 of her neighbours in April")
    assert not index.overlaps("hi there, how are you")
    assert index.contains([{"role": "user", "content": "x"}, {"role": "assistant", "content": "Who wrote the Iliad"}])


def write_rows(path, questions):
    path.write_text("".join(json.dumps({"question": q, "answer": "w3 w4 w5"}) + "\n" for q in questions))
    return path


def test_a_mix_keeps_every_source_and_drops_evaluation_prompts(tmp_path, monkeypatch):
    """Two files mixed with counts; one training question is a GSM8K test question (an evaluation prompt):
    the training split drops it and says so, the test split (held-out evaluation) keeps everything."""
    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    evaluated = "w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20 w21"
    write_rows(data / "gsm8k" / "test.jsonl", [evaluated])
    monkeypatch.setenv("FORETELL_DATA", str(data))
    a = write_rows(tmp_path / "a.jsonl", [f"w{5 + i} w{6 + i} w7" for i in range(6)] + [f"w1 {evaluated} w2"])
    b = write_rows(tmp_path / "b.jsonl", [f"w30 w{31 + i}" for i in range(6)])
    tok = make_tokenizer(VOCAB)
    report = DataReport()
    mixed = build_token_data(DataConfig(f"{a},{b}:4", seq_len=16, pack=False), tok, report)
    assert report.rows == {str(a): 6, str(b): 4} and len(mixed) == 10
    assert report.heldout_dropped == 1 and report.heldout_kept >= 10
    assert "gsm8k" not in report.unchecked and "spec-bench" in report.unchecked  # only GSM8K installed here
    assert all(tok.decode(row).count("w10 w11 w12") == 0 for row in mixed.input_ids.tolist())
    test_split = build_token_data(DataConfig(str(a), split="test", seq_len=32, pack=False), tok)
    assert len(test_split) == 7
