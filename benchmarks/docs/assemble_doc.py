"""Assemble docs/benchmarks.md from `foretell bench` output folders (run by benchmarks_doc.sh): per run its command,
overall table and speedup by category (benchmarks/docs/report_table.py), the tree-budget notes and plots."""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_table import by_category, notes, table  # noqa: E402

DOCS = Path("docs")
COLUMNS = ["method", "tok/s", "speedup", "tau", "drafts verified / pass", "memory MB"]
NOTES = ["Best fixed budget", "The tuner verified", "Dynamic tree vs chain", "Hardware-aware dynamic tree vs chain"]


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
    methods = ["draft-chain", "draft-tree", "draft-tree-auto"] if settings.get("draft") else ["prompt-lookup",
                                                                                            "hf-prompt-lookup"]
    parts = [
        f"## {settings.get('model')}" + (f" with draft {settings['draft']}" if settings.get("draft") else ""),
        f"Command: `{command(settings)}`",
        "All prompts:",
        table(report, COLUMNS),
        by_category(report, "speedup", methods),
        notes(report, NOTES),
        f"![speedup](img/{name}_speedup.png) ![acceptance](img/{name}_acceptance.png)",
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def main(run_dirs: list[str]) -> None:
    (DOCS / "img").mkdir(parents=True, exist_ok=True)
    cost_curves = sorted(p.name for p in (DOCS / "img").glob("cost_*.png"))
    print("# foretell benchmarks\n")
    print("`foretell bench` on SmolLM2-135M (prompt lookup, foretell's and transformers') and on Qwen2.5-Coder-1.5B "
          "with Qwen2.5-Coder-0.5B as draft model (a chain of 4, the dynamic tree at fixed budgets and at the "
          "hardware-aware budget): Spec-Bench, 4 prompts a category, 128 new tokens, bf16, greedy. "
          "`bash benchmarks/docs/benchmarks_doc.sh` reproduces it (resumable; `PER_CATEGORY`, `MAX_NEW_TOKENS`, "
          "`SKIP_QWEN=1`). The run's record: "
          "[results.md](results.md#draft-models-prompt-lookup-and-tree-budgets-foretell-bench).\n")
    print(f"Machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, no GPU. "
          "Speedups are against plain decoding in the same run, methods interleaved prompt by prompt; memory MB is "
          "one method's weights plus its KV caches.\n")
    for d in run_dirs:
        print(section(Path(d)))
    if cost_curves:
        print("## Forward cost curves\n")
        print("What one target forward costs as the number of verified tokens grows "
              "(`foretell cost MODEL --plot FILE`); the hardware-aware budgets are chosen from these.\n")
        for c in cost_curves:
            print(f"![{c}](img/{c})\n")
    print("## Conclusion\n")
    print("On a CPU a verified token is not free (the cost curves above), so a larger fixed tree raises tau and "
          "loses speed; the hardware-aware budget verifies fewer tokens a pass and is the fastest tree. Prompt lookup "
          "pays most where the answer repeats the prompt (translation, math, RAG).")


if __name__ == "__main__":
    main(sys.argv[1:])
