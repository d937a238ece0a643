"""Issue 20's acceptance criteria against one greedy and one sampled run over its acceptance set (GSM8K test +
Spec-Bench, benchmarks/bench/acceptance.sh): for each shipped drafter (methods named smollm2-135m-*), every criterion's
measured figure and whether it holds, then which shipped drafters meet them all. Prints markdown.

    .venv/bin/python benchmarks/bench/acceptance_check.py runs/acceptance/greedy runs/acceptance/t0.7
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from foretell.bench.report import OVERALL, MethodSummary, summarize

SHIPPED_PREFIX = "smollm2-135m-"
CRITERIA = (  # name, target, where
    ("overall speedup, greedy", 2.0, "speedup"),
    ("GSM8K speedup", 2.5, "speedup"),
    ("lowest Spec-Bench category speedup", 1.5, "speedup"),
    ("GSM8K tau", 3.0, "tau"),
    ("overall speedup, T=0.7", 1.6, "speedup"),
)


def load(folder: Path) -> tuple[dict[str, dict[str, MethodSummary]], list[dict], float]:
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    temperature = json.loads((folder / "bench.json").read_text())["settings"].get("temperature") or 0.0
    groups = {category: {s.method: s for s in summaries} for category, summaries in summarize(rows).items()}
    return groups, rows, temperature


def figures(method: str, greedy, sampled, spec_bench: list[str]) -> list[tuple[float | None, str]]:
    """The five criteria's measured values for `method` (None where it did not run), with a note."""
    def get(groups, category, what):
        s = groups.get(category, {}).get(method)
        return None if s is None else getattr(s, what)

    by_category = {c: get(greedy, c, "speedup") for c in spec_bench}
    known = {c: v for c, v in by_category.items() if v is not None}
    worst = min(known, key=known.get) if known else None
    return [(get(greedy, OVERALL, "speedup"), ""), (get(greedy, "gsm8k", "speedup"), ""),
            (known[worst] if worst else None, f" ({worst})" if worst else ""), (get(greedy, "gsm8k", "tau"), ""),
            (get(sampled, OVERALL, "speedup"), "")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("greedy", type=Path, help="benchmarks/bench/acceptance.sh's greedy run folder")
    ap.add_argument("sampled", type=Path, help="its T=0.7 run folder")
    args = ap.parse_args()
    greedy, rows, t_greedy = load(args.greedy)
    sampled, _, t_sampled = load(args.sampled)
    if t_greedy != 0 or t_sampled == 0:
        raise SystemExit(f"need a greedy and a sampled run, got temperatures {t_greedy:g} and {t_sampled:g}")
    if "gsm8k" not in greedy:
        raise SystemExit(f"{args.greedy} has no GSM8K prompts: run benchmarks/bench/acceptance.sh")
    spec_bench = sorted({r["category"] for r in rows if r["dataset"] == "spec-bench"})
    methods = [m for m in greedy[OVERALL] if m.startswith(SHIPPED_PREFIX) or m == "prompt-lookup"]
    table = {m: figures(m, greedy, sampled, spec_bench) for m in methods}
    plain = greedy[OVERALL]["plain"]
    datasets = sorted({r["dataset"] for r in rows})
    print(f"Plain decoding {plain.tokens_per_s:.1f} tok/s over {plain.prompts} prompts ({', '.join(datasets)}; "
          f"Spec-Bench categories: {', '.join(spec_bench)}); sampled run at T={t_sampled:g}."
          + (" Overall figures cover every data set of the run; the acceptance set is GSM8K + Spec-Bench."
             if set(datasets) != {"gsm8k", "spec-bench"} else "") + "\n")
    print("| criterion | target | " + " | ".join(methods) + " |\n|---|---:|" + "---:|" * len(methods))
    for i, (name, target, what) in enumerate(CRITERIA):
        cells = []
        for m in methods:
            value, note = table[m][i]
            mark = "" if value is None else (" ✓" if value >= target else "")
            cells.append("–" if value is None else f"{value:.2f}{'x' if what == 'speedup' else ''}{note}{mark}")
        print(f"| {name} | >= {target:.1f}{'x' if what == 'speedup' else ''} | " + " | ".join(cells) + " |")
    equal = [greedy[OVERALL][m].greedy_equal for m in methods]
    print("| greedy output = plain decoding's | all | " + " | ".join(f"{e}/{n}" for e, n in equal) + " |")
    shipped = [m for m in methods if m.startswith(SHIPPED_PREFIX)]
    met = [m for m in shipped if all(v is not None and v >= t for (v, _), (_, t, _) in zip(table[m], CRITERIA))]
    print("\n✓: the criterion holds. prompt-lookup (no corpus) is shown for reference; it is not a shipped drafter.")
    print(f"Shipped drafters meeting every criterion: {', '.join(met) if met else 'none'}.")


if __name__ == "__main__":
    main()
