"""The README stays short, every relative link in README.md and docs/*.md resolves, and docs/results.md is generated.

No models, no network: external http(s) and mailto links are not checked. A link's `#anchor` must match a
heading of the target file under GitHub's slug rules (see github_slug).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_LIMIT = 8000  # characters as `wc -c README.md` counts them (bytes)
DOC_FILES = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`\n]*`+")
# [text](target) and ![alt](target); the target may carry a "title" after a space, or sit in <...>.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation other than '-' and '_' removed,
    each space turned into '-'. Markdown in the heading counts by its text: [text](url) -> text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The link and image targets of a Markdown file, outside code."""
    out = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            out.append(m.group(1).strip("<>"))
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in links(path):
        if re.match(r"^(https?:|mailto:)", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if anchor:
            if dest.suffix != ".md" or not dest.is_file():
                problems.append(f"{target}: an anchor into a file that is not Markdown")
            elif unquote(anchor).lower() not in anchors(dest):
                problems.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def test_github_slug():
    assert github_slug("Speed (CPU, 2 cores, bf16, greedy)") == "speed-cpu-2-cores-bf16-greedy"
    assert github_slug("Training draft models: `foretell train adaspec`") == "training-draft-models-foretell-train-adaspec"
    assert github_slug("Seed 000's checklist") == "seed-000s-checklist"
    assert github_slug("GSM8K + Spec-Bench") == "gsm8k--spec-bench"
    assert github_slug("draft_quant and hot_vocab") == "draft_quant-and-hot_vocab"
    assert github_slug("See [the docs](docs/usage.md)") == "see-the-docs"


def test_anchors_number_repeated_headings(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n## Runs\n\n```\n# not a heading\n```\n\n## Runs\n", encoding="utf-8")
    assert anchors(doc) == {"title", "runs", "runs-1"}


def test_link_extraction_skips_code_and_external(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text(
        "See [b](b.md#part) and ![img](pic.png \"title\") and [web](https://example.com).\n"
        "`[code](nothing.md)`\n```\n[fenced](nothing.md)\n```\n",
        encoding="utf-8",
    )
    assert links(doc) == ["b.md#part", "pic.png", "https://example.com"]
    (tmp_path / "b.md").write_text("## Part\n", encoding="utf-8")
    assert broken_links(doc) == ["pic.png: no file " + str((tmp_path / "pic.png").resolve())]


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} characters; keep it at most {README_LIMIT} (move detail to docs/)"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(path):
    assert broken_links(path) == []


def test_results_page_is_generated():
    """docs/results.md is what benchmarks/docs/results_doc.py writes from benchmarks/results/index.json."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "docs" / "results_doc.py")],
                         capture_output=True, text=True, check=True).stdout
    assert out == (ROOT / "docs" / "results.md").read_text(encoding="utf-8"), (
        "docs/results.md is out of date: .venv/bin/python benchmarks/docs/results_doc.py > docs/results.md")
