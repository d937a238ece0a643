"""Compact tables from a `foretell bench` report.md, for the generated docs pages.

A report has one `## CATEGORY` table per category (and `## overall`); the pages show a few columns of a few of them.
    report_table.py REPORT [--section overall] [--columns method,tok/s,speedup@gsm8k,...] [--methods a,b]
    report_table.py REPORT --by-category speedup [--methods a,b]
    report_table.py REPORT --notes "Dynamic tree vs chain" [--notes ...]
    report_table.py --compare LABEL=REPORT [--compare ...] --methods a,b [--cell "{speedup} ({tau})"]
A column `NAME@SECTION` is NAME from that section's table (headed "SECTION NAME"); rows follow --methods' order
(default: the section's own). --notes prints the report's lines that start with each prefix (after --section's table,
if --columns is given).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OVERALL = "overall"


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def sections(text: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Each `## NAME` section's first table: its header and rows."""
    out: dict[str, tuple[list[str], list[list[str]]]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
        elif name is None:
            continue
        elif not line.startswith("|"):
            if name in out:
                name = None  # the table ended: later tables of the section are not read
        elif name not in out:
            out[name] = (cells(line), [])
        elif not set(line) <= set("|-: "):
            out[name][1].append(cells(line))
    return out


def table(text: str, columns: list[str], section: str = OVERALL, methods: list[str] | None = None) -> str:
    found = sections(text)
    rows: dict[str, dict[str, str]] = {}
    order: list[str] = []
    labels = []
    for col in columns:
        name, _, where = col.partition("@")
        where = where or section
        header, body = found[where]
        labels.append(name if where == section else f"{where} {name}")
        for row in body:
            rows.setdefault(row[0], {})[col] = row[header.index(name)]
            if where == section and row[0] not in order:
                order.append(row[0])
    keep = [m for m in (methods or order) if m in rows]
    lines = ["| " + " | ".join(labels) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(rows[m].get(c, "–") for c in columns) + " |" for m in keep]
    return "\n".join(lines)


def by_category(text: str, column: str, methods: list[str] | None = None) -> str:
    """One column (e.g. speedup) of the chosen methods in every category, overall last."""
    found = sections(text)
    names = [n for n, (header, _) in found.items() if header[:1] == ["method"] and column in header and n != OVERALL]
    body = table(text, ["method"] + [f"{column}@{n}" for n in names] + [column], OVERALL, methods).split("\n")
    return "\n".join([f"| {column} | " + " | ".join(names + [OVERALL]) + " |"] + body[1:])


def compare(runs: list[tuple[str, str]], methods: list[str], cell: str = "{speedup}", section: str = OVERALL) -> str:
    """The same methods in several runs: a row a method, a column a run, each cell `cell` filled from its row."""
    found = []
    for _, text in runs:
        header, body = sections(text)[section]
        found.append({row[0]: dict(zip(header, row)) for row in body})
    lines = ["| method | " + " | ".join(label for label, _ in runs) + " |", "|---|" + "---:|" * len(runs)]
    for m in methods:
        filled = (cell.format_map(rows[m]) if m in rows else "–" for rows in found)
        lines.append(f"| {m} | " + " | ".join(filled) + " |")
    return "\n".join(lines)


def notes(text: str, prefixes: list[str]) -> str:
    return "\n\n".join(line.strip() for line in text.splitlines() if any(line.strip().startswith(p) for p in prefixes))


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", nargs="?")
    p.add_argument("--section", default=OVERALL)
    p.add_argument("--columns", help="comma-separated report columns (NAME or NAME@SECTION)")
    p.add_argument("--methods", help="comma-separated methods, in the order to show them")
    p.add_argument("--by-category", metavar="COLUMN")
    p.add_argument("--notes", action="append", default=[], metavar="PREFIX")
    p.add_argument("--compare", action="append", default=[], metavar="LABEL=REPORT")
    p.add_argument("--cell", default="{speedup}", help="a --compare cell: report columns in braces")
    args = p.parse_args(argv)
    methods = args.methods.split(",") if args.methods else None
    if args.compare:
        runs = [(label, Path(path).read_text()) for label, path in (c.split("=", 1) for c in args.compare)]
        print(compare(runs, methods or [], args.cell, args.section))
        return
    text = Path(args.report).read_text()
    parts = []
    if args.columns:
        parts.append(table(text, args.columns.split(","), args.section, methods))
    if args.by_category:
        parts.append(by_category(text, args.by_category, methods))
    if args.notes:
        parts.append(notes(text, args.notes))
    print("\n\n".join(x for x in parts if x))


if __name__ == "__main__":
    main(sys.argv[1:])
