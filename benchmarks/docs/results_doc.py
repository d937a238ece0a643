"""Write docs/results.md, the one page of recorded results, from the files under benchmarks/results/.

    .venv/bin/python benchmarks/docs/results_doc.py > docs/results.md

benchmarks/results/index.json lists what the page shows, section by section: for each recorded run its title (the
heading other pages link to), the machine it ran on, the command that reproduces it, and where its figures are. The
page shows each run's headline figures and links its recorded files for the full tables. A run is one of:

- "bench": a `foretell bench` output folder (bench.json, report.md): the page shows its settings and one line from
  the overall rows of its report (plain tok/s; each method's speedup and tau; greedy = plain where a method's greedy
  output differed from plain decoding's on some prompts); "methods" limits the rows;
- "file": a result file: a `foretell bench` report.md shows as a bench run does; otherwise the page shows the run's
  "headline" (a sentence of its key figures; every number in it must occur in its recorded files, or the page is not
  written), else the file's first table if it fits FILE_WORDS words; "tables" (0-based table numbers, [] for none)
  picks tables instead;
- "table": figures recorded in the index itself (runs whose output folder is not kept), with their settings: shown
  whole, as the index is their only record.

Optional per run: "settings" (a sentence), "links" (more recorded files, or docs/ pages), "note" (shown after the
figures), "removed" (a one-off script kept in git history).

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
FILE_WORDS = 60  # most words (as `wc -w` counts them) of the one table the page shows from a result file
SETTINGS = [("model", ""), ("draft", "draft"), ("dtype", ""), ("quant", ""),
            ("temperature", "T"), ("seed", "seed"), ("max_new_tokens", "tokens")]
NAMES = {"report.md", "results.json", "eval.md"}  # file names that say little alone: linked with their folder


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


def overall(report: Path, methods: list[str] | None) -> str:
    """One line from the overall table of a `foretell bench` report (only `methods`' rows if given): plain decoding's
    tok/s, each other method's speedup and tau, and greedy = plain where it does not hold on every prompt."""
    text = report.read_text(encoding="utf-8")
    part = text.split("\n## overall", 1)
    found = tables(part[1] if len(part) == 2 else text)
    if not found:
        raise SystemExit(f"{report}: no table")
    lines = found[0] if len(part) == 2 else found[-1]
    header = table_rows(lines[0])
    plain, parts, matched = "", [], []
    for line in lines[2:]:
        row = dict(zip(header, table_rows(line)))
        if methods and row["method"] not in methods:
            continue
        same = row.get("greedy = plain", "").replace(" ", "")
        if "/" in same:
            matched.append(same.split("/")[0] == same.split("/")[1])
        if row["method"] == "plain":
            plain = f"plain {row['tok/s']} tok/s"
            continue
        figure = f"{row['method']} {row.get('speedup', '?')}"
        if row.get("tau", "").strip() not in ("", "-", "–"):
            figure += f" ({row['tau']})"
        if "/" in same and not matched[-1]:
            figure += f" [{same}]"
        parts.append(figure)
    line = (f"{plain}; " if plain else "") + "speedup (tau) " + "; ".join(parts) + "."
    if matched and all(matched):
        line += " Greedy = plain."
    elif matched:
        line += " [n/m]: prompts with greedy = plain."
    return line


def is_bench_report(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return path.name == "report.md" and text.startswith("# foretell bench") and "\n## overall" in text


def checked_headline(run: dict, paths: list[Path]) -> str:
    """The run's headline, once every number in it is found in one of its recorded files."""
    text = "\n".join(path.read_text(encoding="utf-8", errors="replace") for path in paths if path.is_file())
    for number in re.findall(r"\d+(?:\.\d+)?", run["headline"]):
        if not re.search(rf"(?<![\d.]){re.escape(number)}(?!\d)", text):
            raise SystemExit(f"{run['title']!r}: headline figure {number} is in none of its recorded files")
    return run["headline"]


def file_tables(path: Path, picked: list[int] | None) -> list[list[str]]:
    """The tables of a result file the page shows: those `picked`, else the first if it fits FILE_WORDS words."""
    found = tables(path.read_text(encoding="utf-8"))
    if picked is not None:
        return [found[i] for i in picked]
    return found[:1] if found and len(" ".join(found[0]).split()) <= FILE_WORDS else []  # words as `wc -w` counts


def settings_line(folder: Path) -> str:
    if (folder / "bench.json").exists():
        settings = json.loads((folder / "bench.json").read_text(encoding="utf-8")).get("settings", {})
    else:  # older output folders keep only the report, whose first lines name the settings
        line = next((l for l in (folder / "report.md").read_text(encoding="utf-8").splitlines()
                     if l.startswith("Settings: ")), "")
        settings = {k: v for k, v in re.findall(r"(\w+)=([^,]+)", line.split(", spec_configs")[0])}
        settings = {k: (None if v == "None" else float(v) if k == "temperature" else v) for k, v in settings.items()}
    parts = [f"{settings[key]} {label}" if key == "max_new_tokens" else f"{label} {settings[key]}" if label
             else str(settings[key]) for key, label in SETTINGS
             if settings.get(key) not in (None, "", "none") and not (key == "temperature" and settings[key] == 0.0)]
    if settings.get("temperature", 0.0) == 0.0:
        parts.append("greedy")
    return ", ".join(parts)


def need(path: Path) -> Path:
    if not path.exists():
        raise SystemExit(f"benchmarks/results/index.json names {path.relative_to(ROOT)}, which does not exist")
    return path


def label(path: str) -> str:
    """A recorded file's link text: its name, with its folder's where the name alone says little."""
    name = Path(path)
    return f"{name.parent.name}/{name.name}" if name.name in NAMES and name.parent.name else name.name


def run_block(run: dict, machines: dict) -> list[str]:
    out = [f"### {run['title']}", ""]
    facts, links, recorded = [], [], []
    if run.get("machine"):
        if run["machine"] not in machines:
            raise SystemExit(f"unknown machine {run['machine']!r} in {run['title']!r}")
        facts.append(f"`{run['machine']}`")
    if "bench" in run:
        folder = need(RESULTS / run["bench"])
        need(folder / "report.md")
        facts.append(settings_line(folder))
        links.append(f"[report]({LINK_BASE}{run['bench']}/report.md)")
    if "file" in run:
        recorded.append(need(RESULTS / run["file"]))
        links.append(f"[{label(run['file'])}]({LINK_BASE}{run['file']})")
    for extra in run.get("links", []):
        recorded.append(need(RESULTS / extra if not extra.startswith("docs/") else ROOT / extra))
        target = f"{LINK_BASE}{extra}" if not extra.startswith("docs/") else extra[len("docs/"):]
        links.append(f"[{label(extra)}]({target})")
    line = "; ".join(facts + [", ".join(links)] if links else facts)
    if line:
        out += [line + ".", ""]
    if run.get("settings"):
        out += [run["settings"], ""]
    if run.get("removed"):
        out += [f"Script from git history (code of its time): `git show {HISTORY}:benchmarks/{run['removed']} > "
                f"{run['removed']}`", ""]
    if run.get("command") and "\n" not in run["command"] and "`" not in run["command"]:
        out += [f"`{run['command']}`", ""]
    elif run.get("command"):
        out += ["```bash", run["command"], "```", ""]
    if "bench" in run:
        out += [overall(RESULTS / run["bench"] / "report.md", run.get("methods")), ""]
    if "file" in run and is_bench_report(RESULTS / run["file"]):
        out += [overall(RESULTS / run["file"], run.get("methods")), ""]
    elif "file" in run:
        if run.get("headline"):
            out += [checked_headline(run, recorded), ""]
        for table in file_tables(RESULTS / run["file"], run.get("tables", [] if run.get("headline") else None)):
            out += table + [""]
    if "table" in run:
        columns, rows = run["table"]["columns"], run["table"]["rows"]
        out.append("| " + " | ".join(columns) + " |")
        out.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|")
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        out.append("")
    if run.get("note"):
        out += [run["note"], ""]
    return out


def slug(title: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def main() -> None:
    index = json.loads(INDEX.read_text(encoding="utf-8"))
    machines = index["machines"]
    out = ["# Recorded results", "",
           "<!-- Generated by benchmarks/docs/results_doc.py from benchmarks/results/index.json; do not edit. -->", ""]
    out += [index["about"] + " Each run shows its headline figures; the files it links hold its full tables.", "",
            "Machines:", ""]
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
