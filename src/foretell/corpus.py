"""A corpus of text the target wrote, kept as a table of its most frequent continuations (retrieval drafting in
the spirit of REST, He et al. 2023, and SuffixDecoding, Oliaro et al. 2024).

A small model answers in habits: "To solve this problem, we need to", "Let's break it down step by step". Its own
answers to many prompts hold those habits, so the n-grams (n = 2..4) of its answer tokens, each mapped to the token
that most often followed it, predict its next tokens wherever the prompt and the output so far offer no match:
where prompt lookup finds nothing, and from the very first token of an answer (keys reach into the chat
template). A continuation is built by looking up the longest known suffix again after each proposed token.

Only confident entries are kept (seen `min_count` times, with at least `min_share` of that key's continuations),
so a table of some hundred thousand keys loads in a fraction of a second. Drafting from it costs microseconds
and is lossless like any deterministic draft: the target verifies every token.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from foretell.errors import ForetellError

CORPUS_FILE = "corpus.npz"
ORDERS = (2, 3, 4)  # key lengths; a single token is too weak a key


@dataclass
class Corpus:
    tables: dict[int, dict[tuple[int, ...], int]]  # key length n -> {n tokens: the token that most often followed}
    settings: dict = field(default_factory=dict)  # how it was built (min_count, min_share, sequences, tokens)

    @property
    def keys(self) -> int:
        return sum(map(len, self.tables.values()))

    def next_token(self, context: list[int]) -> tuple[int | None, int]:
        """The continuation of the longest known suffix of `context` and that suffix's length (None, 0: none)."""
        for n in sorted(self.tables, reverse=True):
            if len(context) >= n:
                token = self.tables[n].get(tuple(context[len(context) - n:]))
                if token is not None:
                    return token, n
        return None, 0

    def match(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        """Up to max_tokens proposed tokens, each the continuation of the longest known suffix so far, and the
        first key's length (0 when the corpus knows no suffix of `context`)."""
        out: list[int] = []
        token, first = self.next_token(context)
        tail = list(context[-max(ORDERS):])
        while token is not None and len(out) < max_tokens:
            out.append(token)
            tail = tail[1:] + [token]
            token, _ = self.next_token(tail)
        return out, first

    def save(self, path: Path) -> None:
        """An .npz file (np.load reads it) whose bytes depend only on the table: entries sorted, no timestamps, so
        the same answers give the same checksum."""
        arrays = {}
        for n, table in sorted(self.tables.items()):
            items = sorted(table.items())
            keys = np.array([k for k, _ in items], dtype=np.int32).reshape(-1, n)
            arrays[f"keys{n}"], arrays[f"next{n}"] = keys, np.array([v for _, v in items], dtype=np.int32)
        arrays["settings"] = np.frombuffer(json.dumps(self.settings, sort_keys=True).encode(), dtype=np.uint8)
        with zipfile.ZipFile(path, "w") as archive:
            for name, array in arrays.items():
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, array, allow_pickle=False)
                archive.writestr(zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue(),
                                 compress_type=zipfile.ZIP_DEFLATED)

    @classmethod
    def load(cls, path: Path) -> Corpus:
        try:
            with np.load(path, allow_pickle=False) as data:
                tables = {}
                for n in ORDERS:
                    if f"keys{n}" in data:
                        keys, nxt = data[f"keys{n}"], data[f"next{n}"]
                        if keys.ndim != 2 or keys.shape[1] != n or len(keys) != len(nxt):
                            raise ValueError(f"table {n} has keys of shape {keys.shape} for {len(nxt)} tokens")
                        tables[n] = dict(zip(map(tuple, keys.tolist()), nxt.tolist()))
                settings = json.loads(bytes(data["settings"]).decode()) if "settings" in data else {}
        except FileNotFoundError:
            raise ForetellError(f"no corpus file {path}: build one with `foretell corpus`") from None
        except Exception as e:  # a truncated or foreign file: zipfile, pickle and shape errors alike
            raise ForetellError(f"{path} is not a readable corpus ({type(e).__name__}: {e}); rebuild it with "
                                "`foretell corpus`") from None
        if not tables:
            raise ForetellError(f"{path} holds no continuation table; rebuild it with `foretell corpus`")
        return cls(tables, settings)

    def check_vocab(self, vocab_size: int, where: str) -> None:
        """A corpus made with another tokenizer proposes nonsense: refuse one whose tokens exceed the vocabulary."""
        top = max((max(t.values(), default=0) for t in self.tables.values()), default=0)
        built = self.settings.get("vocab_size")
        if top >= vocab_size or (built is not None and built != vocab_size):
            raise ForetellError(f"the corpus {where} was built for a vocabulary of {built or 'more than ' + str(top)} "
                                f"tokens, this target has {vocab_size}: build one with this target's tokenizer "
                                "(`foretell corpus`)")


def build_corpus(sequences: Iterable[tuple[list[int], list[bool]]], vocab_size: int, min_count: int = 2,
                 min_share: float = 0.3) -> Corpus:
    """The continuation table of `sequences`: (token ids, per token whether it is answer text). Keys may reach
    into the prompt; only answer tokens are predicted."""
    ids_parts, flag_parts, count, answer_tokens = [], [], 0, 0
    for ids, flags in sequences:
        if len(ids) != len(flags):
            raise ForetellError(f"a corpus sequence has {len(ids)} tokens but {len(flags)} answer flags")
        ids_parts += [np.asarray(ids, dtype=np.int64), np.array([-1])]  # -1 keeps keys from spanning two sequences
        flag_parts += [np.asarray(flags, dtype=bool), np.array([False])]
        count, answer_tokens = count + 1, answer_tokens + int(sum(flags))
    if not answer_tokens:
        raise ForetellError("the corpus has no answer tokens to learn continuations from")
    ids, flags = np.concatenate(ids_parts), np.concatenate(flag_parts)
    tables = {}
    for n in ORDERS:
        windows = np.lib.stride_tricks.sliding_window_view(ids, n + 1)  # [key..., next]
        keep = flags[n:] & (windows >= 0).all(axis=1)
        rows, counts = np.unique(windows[keep], axis=0, return_counts=True)  # sorted by key, then next token
        if not len(rows):
            continue
        new_key = np.ones(len(rows), dtype=bool)
        new_key[1:] = (rows[1:, :n] != rows[:-1, :n]).any(axis=1)
        group = np.cumsum(new_key) - 1
        totals = np.bincount(group, weights=counts)
        best = np.lexsort((-counts, group))  # each key's most frequent continuation first
        first = best[np.r_[True, group[best][1:] != group[best][:-1]]]
        confident = (counts[first] >= min_count) & (counts[first] >= min_share * totals[group[first]])
        chosen = rows[first[confident]]
        tables[n] = dict(zip(map(tuple, chosen[:, :n].tolist()), chosen[:, n].tolist()))
    settings = {"min_count": min_count, "min_share": min_share, "sequences": count, "answer_tokens": answer_tokens,
                "vocab_size": vocab_size}
    return Corpus(tables, settings)
