"""What the in-process prefix-cache benchmarks share (multi_turn.py, n_choices.py): the cache off and on taking
turns on fresh engines, their answers checked equal, and the report written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

OFF, ON = "prefix cache off", "prefix cache on"


def add_run_args(p: argparse.ArgumentParser, out: str) -> None:
    """The flags both benchmarks take: the target and drafter, the cached configuration's size, rounds, threads,
    the output folder."""
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quant", default="gguf-q8")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--drafter", default="none", help="a method name, or default (the target's)")
    p.add_argument("--cache-mb", type=int, default=512, help="the cached configuration's size (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(out))


def off_and_on(serve: Callable[[bool], dict], rounds: int, answers_are: str) -> dict[str, list[dict]]:
    """serve(cache_on) -> one run's figures with its "answers"; each configuration `rounds` times, neither always
    first. Stops when the answers differ (`answers_are` says why they must not)."""
    runs: dict[str, list[dict]] = {OFF: [], ON: []}
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            runs[name].append(serve(name == ON))
            print(name, json.dumps({k: v for k, v in runs[name][-1].items() if k != "answers"}), flush=True)
    if any(run["answers"] != runs[OFF][0]["answers"] for group in runs.values() for run in group):
        raise SystemExit(f"the answers differ between runs: {answers_are} with and without the cache must agree")
    return runs


def write_report(out: Path, args: argparse.Namespace, summary: dict, runs: dict[str, list[dict]],
                 lines: list[str]) -> None:
    """OUT/results.json (settings, summary, every run's figures) and OUT/report.md (`lines`), printed too."""
    out.mkdir(parents=True, exist_ok=True)
    figures = {name: [{k: v for k, v in run.items() if k != "answers"} for run in group] for name, group in runs.items()}
    (out / "results.json").write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()},
                                                  "summary": summary, "runs": figures}, indent=2) + "\n")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
