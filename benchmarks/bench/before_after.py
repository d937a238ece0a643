"""Two checkouts of foretell, before and after a change, run by the same `foretell bench` command in alternating
rounds (before, after, before, after, ...): are the greedy tokens identical for every method and prompt, and is each
method's speed within the noise between rounds of the same checkout?

    .venv/bin/python benchmarks/bench/before_after.py --before /tmp/w/before --after /tmp/w/after \
        --rounds 2 --out benchmarks/results/house_before_after -- --quant gguf-q8 --dtype float32 ...

Each checkout runs with its own src/ on PYTHONPATH (its own kernel build: the build key hashes the sources), in a
fresh process per round. Prints, per method, the ratio of total tokens/s after / before for each round pair and
the same ratio between the two rounds of each checkout alone (the noise to read it against), and writes
summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def run_round(checkout: Path, bench_args: list[str], out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    env.setdefault("FORETELL_DATA", str(Path(__file__).resolve().parents[3] / "shared" / "data"))
    command = [sys.executable, "-m", "foretell.cli", "bench", *bench_args, "--out", str(out), "--no-resume"]
    print(f"[{checkout.name}] {' '.join(command[1:])}", file=sys.stderr, flush=True)
    subprocess.run(command, env=env, cwd=checkout, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def total_rate(rows: list[dict], method: str) -> float:
    mine = [r for r in rows if r["method"] == method]
    return sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)


def compare(rounds: dict[str, list[list[dict]]]) -> dict:
    key = lambda r: (r["dataset"], r["id"], r["method"])  # noqa: E731
    reference = {key(r): r["tokens"] for r in rounds["before"][0]}
    differing = sorted({f"{k[2]} {k[0]}#{k[1]}" for label in rounds for rows in rounds[label] for r in rows
                        if reference.get(k := key(r)) != r["tokens"]})
    methods = sorted({r["method"] for r in rounds["before"][0]}, key=lambda m: (m != "plain", m))
    table = {}
    for method in methods:
        before = [total_rate(rows, method) for rows in rounds["before"]]
        after = [total_rate(rows, method) for rows in rounds["after"]]
        table[method] = {
            "before_tok_s": [round(x, 1) for x in before], "after_tok_s": [round(x, 1) for x in after],
            "after_over_before": [round(a / b, 3) for a, b in zip(after, before)],
            "before_round_spread": round(max(before) / min(before), 3),
            "after_round_spread": round(max(after) / min(after), 3),
            "median_after_over_before": round(statistics.median(a / b for a, b in zip(after, before)), 3),
        }
    return {"prompts_x_methods": len(reference), "tokens_identical": not differing, "differing": differing,
            "methods": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="checkout (worktree) before the change")
    parser.add_argument("--after", type=Path, required=True, help="checkout (worktree) after the change")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then the foretell bench arguments")
    args = parser.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    rounds: dict[str, list[list[dict]]] = {"before": [], "after": []}
    for i in range(args.rounds):
        for label, checkout in (("before", args.before), ("after", args.after)):
            rounds[label].append(run_round(checkout.resolve(), bench_args, args.out.resolve() / f"{label}_{i}"))
    summary = compare(rounds)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"greedy tokens identical over {summary['prompts_x_methods']} prompt x method rows and "
          f"{args.rounds} rounds: {summary['tokens_identical']} {summary['differing'][:5] or ''}")
    print(f"{'method':34s} {'before tok/s':>16s} {'after tok/s':>16s} {'after/before':>16s} {'spread b / a':>14s}")
    for method, m in summary["methods"].items():
        print(f"{method:34s} {str(m['before_tok_s']):>16s} {str(m['after_tok_s']):>16s} "
              f"{str(m['after_over_before']):>16s} {m['before_round_spread']:>6} / {m['after_round_spread']:<6}")


if __name__ == "__main__":
    main()
