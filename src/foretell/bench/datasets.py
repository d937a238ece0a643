"""Benchmark prompts, read from local files only."""

from __future__ import annotations

import json
import os
from pathlib import Path

from foretell.errors import ForetellError

REPO_ROOT = Path(__file__).resolve().parents[3]
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# Spec-Bench labels its 80 MT-Bench questions with MT-Bench's own eight categories.
MT_BENCH_SUBCATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def shared_data_dir() -> Path:
    return Path(os.environ.get("FORETELL_DATA", REPO_ROOT.parent / "shared" / "data"))


def spec_bench_path() -> Path:
    path = shared_data_dir() / "spec_bench" / "question.jsonl"
    if not path.is_file():
        raise ForetellError(f"Spec-Bench questions not found at {path}; set FORETELL_DATA to the folder holding spec_bench/")
    return path


def spec_bench_category(raw: str) -> str:
    return "mt_bench" if raw in MT_BENCH_SUBCATEGORIES else raw


def load_spec_bench(per_category: int, path: Path | None = None) -> list[dict]:
    """The first `per_category` questions of each of Spec-Bench's six categories, in file order.

    Each row: {"id", "category", "prompt"} with the question's first turn as prompt.
    """
    rows = [json.loads(line) for line in Path(path or spec_bench_path()).read_text().splitlines() if line.strip()]
    taken: dict[str, int] = {}
    out = []
    for r in rows:
        cat = spec_bench_category(r["category"])
        if taken.get(cat, 0) < per_category:
            taken[cat] = taken.get(cat, 0) + 1
            out.append({"id": r["question_id"], "category": cat, "prompt": r["turns"][0]})
    return out
