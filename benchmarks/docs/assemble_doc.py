"""Assemble docs/benchmarks.md from `foretell bench` output folders (run by benchmarks_doc.sh)."""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path

import torch


DOCS = Path("docs")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def command(settings: dict) -> str:
    draft = f" --draft {settings['draft']}" if settings.get("draft") else ""
    return (f"foretell bench --model {settings['model']}{draft} --dtype {settings['dtype']} "
            f"--max-new-tokens {settings['max_new_tokens']} (methods and prompts: see benchmarks/docs/benchmarks_doc.sh)")


def section(run_dir: Path) -> str:
    settings = json.loads((run_dir / "bench.json").read_text()).get("settings", {})
    name = run_dir.name
    for png in ("speedup.png", "acceptance.png"):
        shutil.copy(run_dir / png, DOCS / "img" / f"{name}_{png}")
    report = (run_dir / "report.md").read_text()
    report = report.split("\n", 1)[1] if report.startswith("# ") else report  # drop its own title
    # Its own plot links point next to report.md; the doc links the copies in img/ below instead.
    report = "\n".join("#" + line if line.startswith("## ") else line for line in report.splitlines()
                       if not line.startswith("![") or "](img/" in line)
    return "\n".join([
        f"## {settings.get('model')}" + (f" with draft {settings['draft']}" if settings.get("draft") else ""),
        "",
        f"Command: `{command(settings)}`",
        "",
        report,
        "",
        f"![speedup](img/{name}_speedup.png) ![acceptance](img/{name}_acceptance.png)",
        "",
    ])


def main(run_dirs: list[str]) -> None:
    (DOCS / "img").mkdir(parents=True, exist_ok=True)
    cost_curves = sorted(p.name for p in (DOCS / "img").glob("cost_*.png"))
    print("# foretell benchmarks\n")
    print("Produced by `bash benchmarks/docs/benchmarks_doc.sh` (resumable; `PER_CATEGORY` and "
          "`MAX_NEW_TOKENS` override the defaults of 4 prompts per Spec-Bench category and 128 new tokens).\n")
    print(f"Machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
          "no GPU. Greedy decoding, bf16. Speedups are measured in the same run, methods interleaved "
          "prompt by prompt; `greedy = plain` counts prompts whose output equals foretell's plain "
          "decoding token for token (bf16 ties can flip a token; exactness is tested in fp32).\n")
    for d in run_dirs:
        print(section(Path(d)))
    if cost_curves:
        print("## Forward cost curves\n")
        print("What one target forward costs as the number of verified tokens grows "
              "(`foretell cost MODEL`); the hardware-aware budgets are chosen from these.\n")
        for c in cost_curves:
            print(f"![{c}](img/{c})\n")


if __name__ == "__main__":
    main(sys.argv[1:])
