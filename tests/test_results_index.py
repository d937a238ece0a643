"""Every results folder README.md or docs/*.md cites has an entry in benchmarks/results/index.json, so every
figure the docs quote reaches docs/results.md with its machine and the command that reproduces it.

The docs are read as they are when the test runs (citations come and go as the docs are edited). No models.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "index.json"
CITED = re.compile(r"benchmarks/results/([A-Za-z0-9_.\-/]+)")


def doc_files() -> list[Path]:
    # docs/results.md is written from the index itself: what it cites is indexed by construction
    return [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "results.md")]


def cited_paths(text: str) -> set[str]:
    """Paths under benchmarks/results/ that a text names, as written (trailing punctuation dropped)."""
    return {m.group(1).rstrip("./-") for m in CITED.finditer(text)} - {"", "index.json"}


def indexed_paths(index: dict) -> set[str]:
    """Every path under benchmarks/results/ an index entry shows: its bench folder, its file, its links."""
    out = set()
    for section in index["sections"]:
        for run in section["runs"]:
            out.update(run[key] for key in ("bench", "file") if key in run)
            out.update(link for link in run.get("links", []) if not link.startswith("docs/"))
    return out


def covered(cited: str, indexed: set[str]) -> bool:
    """Whether an entry shows `cited`: the path itself, a run inside the cited folder, the indexed run folder the
    cited file is in, or a file beside an indexed file in the same run folder (report.md and its results.json)."""
    parent = cited.rpartition("/")[0]
    for path in indexed:
        if path == cited or path.startswith(cited + "/") or cited.startswith(path + "/"):
            return True
        if parent and path.rpartition("/")[0] == parent:
            return True
    return False


def test_covered_reads_folders_files_and_neighbours():
    indexed = {"avx2-epyc/corpus/gamma", "qwen_pair_native/report.md", "core_speed_run5.md"}
    assert covered("avx2-epyc", indexed) and covered("avx2-epyc/corpus/gamma/report.md", indexed)
    assert covered("qwen_pair_native/paired.md", indexed) and covered("qwen_pair_native", indexed)
    assert not covered("core_speed_run4_contended.md", indexed)  # top-level files are not neighbours
    assert not covered("gpu_check", indexed) and not covered("avx2-epyc-2", indexed)
    assert cited_paths("see benchmarks/results/gpu_check/, and [x](../benchmarks/results/a/b.md).") == {
        "gpu_check", "a/b.md"}


def test_every_results_folder_the_docs_cite_has_an_index_entry():
    indexed = indexed_paths(json.loads(INDEX.read_text(encoding="utf-8")))
    missing = []
    for doc in doc_files():
        for cited in sorted(cited_paths(doc.read_text(encoding="utf-8"))):
            if not covered(cited, indexed):
                missing.append(f"{doc.relative_to(ROOT)}: benchmarks/results/{cited}")
    assert not missing, ("cited without an entry in benchmarks/results/index.json (add one with its machine and "
                         "command, then .venv/bin/python benchmarks/docs/results_doc.py > docs/results.md):\n  "
                         + "\n  ".join(missing))
