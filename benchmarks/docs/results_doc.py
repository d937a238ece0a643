"""Write docs/results.md, the one page of recorded results, from the files under benchmarks/results/.

    .venv/bin/python benchmarks/docs/results_doc.py > docs/results.md

benchmarks/results/index.json lists what the page shows, section by section: for each recorded run its title, the
machine it ran on, the command that reproduces it, and where its figures are. A run is one of:

- "bench": a `foretell bench` output folder (bench.json, report.md): the page shows its settings and the overall
  rows of its report (method, prompts, tok/s, speedup, tau, drafting / verification time, greedy = plain);
- "file": a Markdown result file: the page shows its tables (the lines of a table, nothing else);
- "table": figures recorded in the index itself (runs whose output folder is not kept), with their settings.

Only the standard library: no model is loaded. Fails on a missing file, so the page never cites a run that is gone.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "index.json"
LINK_BASE = "../benchmarks/results/"  # from docs/results.md
HISTORY = "b525838"  # the last commit with the one-off A/B scripts under benchmarks/
KEEP = ["method", "prompts", "tok/s", "speedup", "tau", "draft / verify ms a pass", "greedy = plain"]
SETTINGS = [("model", "model"), ("draft", "draft"), ("dtype", "dtype"), ("quant", "quant"),
            ("temperature", "T"), ("seed", "seed"), ("max_new_tokens", "new tokens")]


def table_rows(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(text: str) -> list[list[str]]:
    """The Markdown tables of a text, each as its lines."""
    out, current = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            current.append(line.rstrip())
        elif current:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def overall(report: Path, methods: list[str] | None) -> list[str]:
    """The overall table of a `foretell bench` report, cut to the KEEP columns (and to `methods` if given)."""
    text = report.read_text(encoding="utf-8")
    part = text.split("\n## overall", 1)
    found = tables(part[1] if len(part) == 2 else text)
    if not found:
        raise SystemExit(f"{report}: no table")
    lines = found[0] if len(part) == 2 else found[-1]
    header = table_rows(lines[0])
    cols = [header.index(c) for c in KEEP if c in header]
    out = ["| " + " | ".join(header[i] for i in cols) + " |",
           "|" + "|".join("---" if header[i] == "method" else "---:" for i in cols) + "|"]
    for line in lines[2:]:
        cells = table_rows(line)
        if methods and cells[0] not in methods:
            continue
        out.append("| " + " | ".join(cells[i] for i in cols) + " |")
    return out


def settings_line(folder: Path) -> str:
    if (folder / "bench.json").exists():
        settings = json.loads((folder / "bench.json").read_text(encoding="utf-8")).get("settings", {})
    else:  # older output folders keep only the report, whose first lines name the settings
        line = next((l for l in (folder / "report.md").read_text(encoding="utf-8").splitlines()
                     if l.startswith("Settings: ")), "")
        settings = {k: v for k, v in re.findall(r"(\w+)=([^,]+)", line.split(", spec_configs")[0])}
        settings = {k: (None if v == "None" else float(v) if k == "temperature" else v) for k, v in settings.items()}
    parts = [f"{label} {settings[key]}" for key, label in SETTINGS
             if settings.get(key) not in (None, "", "none") and not (key == "temperature" and settings[key] == 0.0)]
    if settings.get("temperature", 0.0) == 0.0:
        parts.append("greedy")
    specs = settings.get("spec_configs") or {}
    if specs:
        parts.append("drafter configurations " + ", ".join(f"`{name}`" for name in specs))
    return "; ".join(parts)


def need(path: Path) -> Path:
    if not path.exists():
        raise SystemExit(f"benchmarks/results/index.json names {path.relative_to(ROOT)}, which does not exist")
    return path


def run_block(run: dict, machines: dict) -> list[str]:
    out = [f"### {run['title']}", ""]
    facts = []
    if run.get("machine"):
        if run["machine"] not in machines:
            raise SystemExit(f"unknown machine {run['machine']!r} in {run['title']!r}")
        facts.append(f"Machine: `{run['machine']}`.")
    if run.get("settings"):
        facts.append(run["settings"])
    if "bench" in run:
        folder = need(RESULTS / run["bench"])
        facts.append(f"Settings: {settings_line(folder)}.")
    if facts:
        out += [" ".join(facts), ""]
    if run.get("removed"):
        out += [f"A one-off script, kept in git history: `git show {HISTORY}:benchmarks/{run['removed']} > "
                f"{run['removed']}` (written against the code of its time).", ""]
    if run.get("command"):
        out += ["```bash", run["command"], "```", ""]
    links = []
    if "bench" in run:
        need(RESULTS / run["bench"] / "report.md")
        links.append(f"[report]({LINK_BASE}{run['bench']}/report.md)")
        out += overall(RESULTS / run["bench"] / "report.md", run.get("methods")) + [""]
    if "file" in run:
        path = need(RESULTS / run["file"])
        links.append(f"[{Path(run['file']).name}]({LINK_BASE}{run['file']})")
        for found in tables(path.read_text(encoding="utf-8")):
            out += found + [""]
    if "table" in run:
        columns, rows = run["table"]["columns"], run["table"]["rows"]
        out.append("| " + " | ".join(columns) + " |")
        out.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|")
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        out.append("")
    for extra in run.get("links", []):
        need(RESULTS / extra if not extra.startswith("docs/") else ROOT / extra)
        target = f"{LINK_BASE}{extra}" if not extra.startswith("docs/") else extra[len("docs/"):]
        links.append(f"[{Path(extra).name}]({target})")
    if run.get("note"):
        out += [run["note"], ""]
    if links:
        out += ["Recorded: " + ", ".join(links) + ".", ""]
    return out


def slug(title: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def main() -> None:
    index = json.loads(INDEX.read_text(encoding="utf-8"))
    machines = index["machines"]
    out = ["# Recorded results", "",
           "<!-- Generated by benchmarks/docs/results_doc.py from benchmarks/results/index.json; do not edit. -->", ""]
    out += [index["about"], "", "Machines:", ""]
    out += [f"- `{key}`: {text}" for key, text in machines.items()] + [""]
    out += [f"- [{s['title']}](#{slug(s['title'])})" for s in index["sections"]] + [""]
    for section in index["sections"]:
        out += [f"## {section['title']}", ""]
        if section.get("about"):
            out += [section["about"], ""]
        for run in section["runs"]:
            out += run_block(run, machines)
    sys.stdout.write("\n".join(out).rstrip() + "\n")


if __name__ == "__main__":
    main()
