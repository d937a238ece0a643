"""The hidden-state drafter's speed ceiling: a fixed-budget bench sweep (hidden-state@N, hidden-state-lookup@N)
set against the target's forward cost curve (src/foretell/bench/ceiling.py says what each column bounds).

    .venv/bin/python benchmarks/bench/hidden_state_ceiling.py --bench runs/hidden-ceiling

Writes BENCH/ceiling.md (printed too) and BENCH/ceiling.png. The cost curve is the cached one of
`foretell cost smollm2-135m --dtype bfloat16 --threads 2`, measured here on first use: run it on free cores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from foretell.bench.ceiling import CeilingPoint, ceiling_points
from foretell.bench.report import OVERALL, summarize
from foretell.bench.runner import RESULTS, read_rows
from foretell.runtime.loading import load_model
from foretell.sizing.cost import cost_curve


def overall_table(points: list[CeilingPoint], target: float) -> list[str]:
    lines = ["| method | drafts verified / pass | tau | measured speedup | free drafting, this CPU | any hardware (= tau) |",
             "|---|---:|---:|---:|---:|---:|"]
    for p in points:
        measured = f"{p.measured:.2f}x" if p.measured is not None else "–"
        lines.append(f"| {p.method} | {p.verified:.1f} | {p.tau:.2f} | {measured} | {p.free_drafting:.2f}x | "
                     f"{p.any_hardware:.2f}x |")
    lines.append("")
    for base in dict.fromkeys(p.base for p in points):
        mine = [p for p in points if p.base == base]
        best_cpu = max(mine, key=lambda p: p.free_drafting)
        best_tau = max(mine, key=lambda p: p.tau)
        lines.append(f"- {base}: at most {best_cpu.free_drafting:.2f}x on this CPU even with free drafting "
                     f"({best_cpu.method}); at most {best_tau.tau:.2f}x on any hardware ({best_tau.method}); "
                     f"target {target:g}x {'within' if best_tau.tau >= target else 'out of'} reach of this draft.")
    return lines


def category_table(groups: dict, points: list[CeilingPoint]) -> list[str]:
    cats = [c for c in groups if c != OVERALL]
    lines = ["| method | " + " | ".join(cats) + " |", "|---|" + "---:|" * len(cats)]
    for p in points:
        cells = []
        for c in cats:
            s = next((s for s in groups[c] if s.method == p.method), None)
            cells.append(f"{s.tau:.2f}" if s is not None and s.tau is not None else "–")
        lines.append(f"| {p.method} | " + " | ".join(cells) + " |")
    return lines


def plot(points: list[CeilingPoint], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, base in enumerate(dict.fromkeys(p.base for p in points)):
        mine = [p for p in points if p.base == base]
        x = [p.budget for p in mine]
        color = f"C{i}"
        ax.plot(x, [p.tau for p in mine], marker="o", color=color, label=f"{base}: any hardware (tau)")
        ax.plot(x, [p.free_drafting for p in mine], marker="s", linestyle="--", color=color,
                label=f"{base}: free drafting, this CPU")
        if all(p.measured is not None for p in mine):
            ax.plot(x, [p.measured for p in mine], marker="^", linestyle=":", color=color, label=f"{base}: measured")
    ax.axhline(target, color="black", linewidth=0.8, linestyle="--")
    ax.axhline(1.0, color="grey", linewidth=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree budget (draft nodes verified a pass, at most)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"speedup ceilings by tree budget (black: the {target:g}x target)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", required=True, help="a foretell bench output folder with @N methods")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", type=float, default=1.8, help="the speedup to reach (seed 000's issue: 1.8)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    bench = Path(args.bench)
    groups = summarize(read_rows(bench / RESULTS))
    curve = cost_curve(load_model(args.model, args.dtype, "cpu").model, args.model)
    points = ceiling_points(groups[OVERALL], curve)
    if not points:
        raise SystemExit(f"no @N methods in {bench / RESULTS}: run the sweep first (benchmarks/bench/hidden_state_ceiling.sh)")
    cells = " ".join(f"{n}:{s * 1000:.1f}" for n, s in zip(curve.sizes, curve.seconds))
    lines = [f"Target forward cost, ms by tokens (context {curve.context}): {cells}", "",
             "### All prompts", "", *overall_table(points, args.target), "",
             "### tau by category (the any-hardware ceiling per category)", "", *category_table(groups, points), "",
             "![ceiling](ceiling.png)", ""]
    (bench / "ceiling.md").write_text("\n".join(lines))
    plot(points, args.target, bench / "ceiling.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
