"""Parallel-head runs side by side on their held-out evaluation (OUT/eval.json): the head's shape, its training
cost, and per-depth acceptance, to tell whether a deeper head buys acceptance the extra drafting time may pay for.

    .venv/bin/python benchmarks/train/head_capacity_table.py RUN [RUN ...]   (train parallel-head --out folders)

Prints a Markdown table; "chain tau" is 1 + the sum of the chain top-1 rates (the tokens a greedy chain of the
head's depth yields a pass, before trees, the scheduler and the lookup branch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def run_row(run: Path) -> str:
    evaluation = json.loads((run / "eval.json").read_text())
    config = json.loads((run / "head" / "parallel_head.json").read_text())["config"]
    log = [json.loads(line) for line in (run / "train" / "log.jsonl").read_text().splitlines() if line.strip()]
    job = json.loads((run / "train" / "job.json").read_text())
    start = Path(job["init_head"]).name if job.get("init_head") else "scratch"
    size_mb = (run / "head" / "model.safetensors").stat().st_size / 2**20
    seconds = sorted(entry["seconds"] for entry in log)
    median = seconds[len(seconds) // 2] if seconds else float("nan")
    draft_vocab = config.get("draft_vocab_size") or "whole"
    top1 = " / ".join(f"{v:.3f}" for v in evaluation["top1"])
    expected = " / ".join(f"{v:.3f}" for v in evaluation["expected_acceptance"])
    tau = 1 + sum(evaluation["chain_top1"])
    return (f"| {run} | {start} | {config['num_layers']} | {draft_vocab} | {size_mb:.0f} | {log[-1]['step'] if log else 0} | "
            f"{median:.2f} | {top1} | {expected} | {tau:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    args = p.parse_args()
    missing = [str(run) for run in args.runs if not (run / "eval.json").exists()]
    if missing:
        raise SystemExit(f"no eval.json (the run has not finished its evaluation) in: {', '.join(missing)}")
    print("| run | from | layers | draft vocabulary | head MB | steps | s / step (median) | top-1 by depth | "
          "expected acceptance by depth | chain tau |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|---:|")
    for run in args.runs:
        print(run_row(run))


if __name__ == "__main__":
    main()
