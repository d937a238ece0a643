"""Per-prompt paired speed ratios of a `foretell bench` run: for each method against a reference method, the
ratio of tokens/s on each prompt both ran, as median and geometric mean beside the ratio of totals; and the
reference's tokens/s over one data set (to hold a server's figure on the same prompts against). With --runs, a
prompt's rows pair run by run (each run its own pair).

    .venv/bin/python benchmarks/bench/paired_ratios.py runs/bench/RUN [--reference plain]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def paired(rows: list[dict], method: str, reference: str) -> dict:
    mine = {(r["dataset"], r["id"], r.get("run", 0)): r for r in rows if r["method"] == method}
    ref = {(r["dataset"], r["id"], r.get("run", 0)): r for r in rows if r["method"] == reference}
    keys = sorted(set(mine) & set(ref), key=str)
    ratios = [mine[k]["tokens_per_s"] / ref[k]["tokens_per_s"] for k in keys]
    total = (sum(mine[k]["new_tokens"] for k in keys) / sum(mine[k]["seconds"] for k in keys)) / (
        sum(ref[k]["new_tokens"] for k in keys) / sum(ref[k]["seconds"] for k in keys))
    return {"method": method, "prompts": len(keys), "total_ratio": round(total, 3),
            "median_ratio": round(statistics.median(ratios), 3),
            "geomean_ratio": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a bench output folder (results.jsonl)")
    p.add_argument("--reference", default="plain")
    args = p.parse_args()
    rows = [json.loads(line) for line in (args.run / "results.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "method" in r and r.get("tokens_per_s")]
    print(f"| method | prompts | total / {args.reference} | median per prompt | geometric mean |")
    print("|---|---:|---:|---:|---:|")
    for method in sorted({r["method"] for r in rows} - {args.reference}):
        r = paired(rows, method, args.reference)
        print(f"| {method} | {r['prompts']} | {r['total_ratio']:.3f} | {r['median_ratio']:.3f} | {r['geomean_ratio']:.3f} |")
    for dataset in sorted({r["dataset"] for r in rows}):
        mine = [r for r in rows if r["method"] == args.reference and r["dataset"] == dataset]
        rate = sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)
        print(f"{args.reference} on {dataset}: {rate:.1f} tok/s over {len(mine)} prompts")


if __name__ == "__main__":
    main()
