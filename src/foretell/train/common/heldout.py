"""Keep the evaluation prompts out of the training data.

Every prompt `foretell bench` can run (Spec-Bench, GSM8K test, MT-Bench, HumanEval; those whose data is
installed) is held out: a training conversation is dropped when any of its turns shares a run of
SHINGLE_WORDS consecutive words with an evaluation prompt, or contains a whole shorter prompt. Words are
lower-cased alphanumeric runs, so spacing, punctuation and case do not hide a copy; runs that are mostly
numbers ("0 1 2 3 ...", a grid) say nothing about where a text came from and are not indexed. The check runs where the
training sequences are built, so a drafter's held-out figures never come from prompts it was trained on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from foretell.bench.datasets import DATASETS
from foretell.errors import ForetellError

SHINGLE_WORDS = 13  # the n-gram length of GPT-3's contamination study
MIN_PROMPT_WORDS = 4  # a shorter prompt ("Hi") matches too much ordinary text to hold out
WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def evaluation_prompts() -> tuple[list[str], list[str]]:
    """The prompts of every bench data set that is available here, and the names of those that are not."""
    prompts, missing = [], []
    for name, loader in DATASETS.items():
        try:
            prompts += [row["prompt"] for row in loader(10**9)]
        except ForetellError:
            missing.append(name)
    return prompts, missing


@dataclass
class HeldOut:
    """An index of evaluation prompts: their SHINGLE_WORDS-word runs (a whole prompt when shorter)."""

    shingles: dict[int, set[tuple[str, ...]]] = field(default_factory=dict)  # run length -> runs
    prompts: int = 0

    @classmethod
    def of(cls, prompts: Iterable[str]) -> HeldOut:
        index = cls()
        for prompt in prompts:
            w = words(prompt)
            if len(w) < MIN_PROMPT_WORDS:
                continue
            n = min(SHINGLE_WORDS, len(w))
            runs = (tuple(w[i : i + n]) for i in range(len(w) - n + 1))
            index.shingles.setdefault(n, set()).update(r for r in runs if _telling(r))
            index.prompts += 1
        return index

    def overlaps(self, text: str) -> bool:
        w = words(text)
        return any(tuple(w[i : i + n]) in runs for n, runs in self.shingles.items() for i in range(len(w) - n + 1))

    def contains(self, messages: list[dict]) -> bool:
        return any(self.overlaps(m.get("content") or "") for m in messages)


def _telling(run: tuple[str, ...]) -> bool:
    """At least two thirds of the words hold a letter."""
    return 3 * sum(any(c.isalpha() for c in word) for word in run) >= 2 * len(run)


@dataclass
class FilterReport:
    kept: int = 0
    dropped: int = 0
    missing: list[str] = field(default_factory=list)  # evaluation sets not installed (not checked against)


def without_heldout(conversations: Iterable[list[dict]], index: HeldOut, report: FilterReport) -> Iterator[list[dict]]:
    """The conversations that share nothing with the evaluation prompts; counts go to `report`."""
    for messages in conversations:
        if index.contains(messages):
            report.dropped += 1
        else:
            report.kept += 1
            yield messages
