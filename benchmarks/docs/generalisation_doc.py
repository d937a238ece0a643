"""The generalisation report's summary tables from benchmarks/bench/generalisation.sh's runs: per category, each
method's speedup over plain decoding and its tau, greedy and sampled side by side, then the issue's acceptance
figures for the best shipped drafter. Prints markdown (docs/generalisation.md holds its output). With
--gain NEW=OLD, per category what drafter NEW (e.g. a head trained on wider data) bought over OLD in the same run
(issue 20's "what the extra data bought"), a table per run.

    .venv/bin/python benchmarks/docs/generalisation_doc.py runs/generalisation runs/generalisation-t0.7
    .venv/bin/python benchmarks/docs/generalisation_doc.py runs/gen_wide --gain eagle3-wide=smollm2-135m-eagle3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from foretell.bench.report import OVERALL, summarize


def load_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]


def label(rows: list[dict], category: str) -> str:
    dataset = next(r["dataset"] for r in rows if r["category"] == category)
    return category if dataset in (category, "gsm8k", "humaneval") else f"{dataset}: {category}"


def cell(summary) -> str:
    return "–" if summary is None or summary.speedup is None else f"{summary.speedup:.2f}x / {summary.tau:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="generalisation.sh output folders (greedy, sampled)")
    ap.add_argument("--gain", metavar="NEW=OLD", action="append",
                    help="per category, what method NEW bought over method OLD (repeatable)")
    args = ap.parse_args()
    runs = args.runs
    all_rows = [load_rows(r) for r in runs]
    temps = [json.loads((r / "bench.json").read_text())["settings"].get("temperature", 0) for r in runs]
    groups = [summarize(rows) for rows in all_rows]
    if args.gain:
        for pair in args.gain:
            new, _, old = pair.partition("=")
            for rows, group, temp in zip(all_rows, groups, temps):
                gain_table(rows, group, temp, new, old)
        return
    methods = [s.method for s in groups[0][OVERALL] if s.method != "plain"]
    head = " | ".join(f"{m} (T={t:g})" for t in temps for m in methods)
    prefill = all("prefill_seconds" in r for r in all_rows[0])  # rows since 2026-12-02 carry it
    print(f"| category | prompts | {head} |" + (" plain: prompt tokens, prefill share |" if prefill else ""))
    print("|---|---:|" + "---:|" * (len(methods) * len(temps) + prefill))
    for category in groups[0]:
        by = [{s.method: s for s in g.get(category, [])} for g in groups]
        prompts = by[0]["plain"].prompts if "plain" in by[0] else 0
        name = "**overall**" if category == OVERALL else label(all_rows[0], category)
        cells = " | ".join(cell(b.get(m)) for b in by for m in methods)
        if prefill:
            cells += " | " + prefill_cell(all_rows[0], None if category == OVERALL else category)
        print(f"| {name} | {prompts} | {cells} |")
    print("\nEach cell: speedup over plain decoding in the same run / tau (tokens per target pass)."
          + (" Last column: plain decoding's mean prompt length and the share of its time spent on the prompt,"
             " which no drafter shortens." if prefill else ""))


def gain_table(rows: list[dict], group: dict, temp: float, new: str, old: str) -> None:
    """Per category: OLD's and NEW's speedup / tau and NEW's gain (speedup ratio, tau difference)."""
    if not any(r["method"] == new for r in rows) or not any(r["method"] == old for r in rows):
        raise SystemExit(f"--gain {new}={old}: the run has methods {sorted({r['method'] for r in rows})}")
    print(f"| category (T={temp:g}) | {old} | {new} | speedup gained | tau gained |\n|---|---:|---:|---:|---:|")
    for category, summaries in group.items():
        by = {s.method: s for s in summaries}
        a, b = by.get(old), by.get(new)
        name = "**overall**" if category == OVERALL else label(rows, category)
        if a is None or b is None or a.speedup is None or b.speedup is None:
            print(f"| {name} | {cell(a)} | {cell(b)} | – | – |")
            continue
        print(f"| {name} | {cell(a)} | {cell(b)} | {b.speedup / a.speedup:.2f}x | {b.tau - a.tau:+.2f} |")
    print("\nCells: speedup over plain decoding in the same run / tau. Gains: NEW's speedup over OLD's (same run), "
          "NEW's tau minus OLD's.\n")


def prefill_cell(rows: list[dict], category: str | None) -> str:
    plain = [r for r in rows if r["method"] == "plain" and category in (None, r["category"])]
    tokens = sum(r["prompt_tokens"] for r in plain) / len(plain)
    return f"{tokens:.0f}, {sum(r['prefill_seconds'] for r in plain) / sum(r['seconds'] for r in plain):.0%}"


if __name__ == "__main__":
    main()
