"""How the adaptive scheduler's choice moves with load (issue 6, item 3).

Three phases over the same GSM8K prompts: idle, loaded (a second process runs matrix products on
one core for the whole phase), idle again. In each phase: plain decoding, the parallel head with
its fixed default tree, and the parallel head with the adaptive scheduler (which keeps learning
across phases). Prints, per phase, the scheduler's mean budget / depth / width and the speedups,
and writes a JSON and a plot of the budget chosen at every step.

    .venv/bin/python benchmarks/bench/scheduler_load.py --head runs/parallel_head/smollm2/head
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.bench.datasets import load_gsm8k
from foretell.drafters.parallel_tree import ParallelHeadDrafter
from foretell.types import SamplingParams

COMPETITOR = "import torch\ntorch.set_num_threads(1)\na = torch.randn(768, 768)\nwhile True:\n    a = (a @ a).tanh()\n"


def run_phase(pipes: dict, prompts: list[list[int]], params: SamplingParams) -> dict:
    out = {}
    for name, pipe in pipes.items():
        tokens, seconds, passes, accepted = 0, 0.0, 0, 0
        for ids in prompts:
            r = pipe.engine.generate(ids, params)
            tokens += r.stats.new_tokens
            seconds += r.stats.decode_seconds
            passes += r.stats.target_passes
            accepted += sum(r.stats.accepted_per_position)
        out[name] = {"tok_s": tokens / seconds, "tau": (accepted + passes) / passes}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", required=True, help="a trained parallel head folder")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", default="runs/scheduler_load")
    args = ap.parse_args()
    torch.set_num_threads(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    auto = load(args.target, SpeculativeConfig(method='parallel-head', model=str(args.head), budget="auto"), dtype="bfloat16")
    fixed = load(args.target, SpeculativeConfig(method='parallel-head', model=str(args.head)), dtype="bfloat16", warm_up=False)
    plain = auto.with_drafter(None)
    scheduler = auto.engine.drafter.scheduler
    assert isinstance(fixed.engine.drafter, ParallelHeadDrafter)
    prompts = [auto.encode(row["prompt"]) for row in load_gsm8k(args.prompts)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    pipes = {"plain": plain, "fixed-tree": fixed, "scheduled": auto}
    run_phase(pipes, prompts[:1], params)  # warm-up: first-call costs and the scheduler's first estimates

    rows, steps = [], []
    for phase in ("idle", "loaded", "idle again"):
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR]) if phase == "loaded" else None
        try:
            time.sleep(1.0 if competitor else 0.0)
            first = len(scheduler.history)
            result = run_phase(pipes, prompts, params)
        finally:
            if competitor:
                competitor.kill()
                competitor.wait()
        chosen = [c for c in scheduler.history[first:] if not c.probe]
        steps.append((phase, [c.nodes for c in scheduler.history[first:]]))
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        rows.append({
            "phase": phase,
            "mean_nodes": mean([c.nodes for c in chosen]),
            "mean_depth": mean([c.depth for c in chosen]),
            "mean_width": mean([c.width for c in chosen]),
            **{f"{k}_tok_s": v["tok_s"] for k, v in result.items()},
            **{f"{k}_tau": v["tau"] for k, v in result.items() if k != "plain"},
            "cost_correction": dict(scheduler.summary().get("cost_correction", {})),
        })
        print(f"{phase}: {json.dumps(rows[-1])}", file=sys.stderr)

    lines = ["| phase | budget (nodes) | depth | width | plain tok/s | fixed tree x | scheduled x | scheduled tau |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {r['mean_nodes']:.1f} | {r['mean_depth']:.2f} | {r['mean_width']:.2f} | "
            f"{r['plain_tok_s']:.1f} | {r['fixed-tree_tok_s'] / r['plain_tok_s']:.2f} | "
            f"{r['scheduled_tok_s'] / r['plain_tok_s']:.2f} | {r['scheduled_tau']:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    (out / "scheduler_load.json").write_text(json.dumps(rows, indent=1))
    (out / "scheduler_load.md").write_text(table + "\n")
    plot(steps, out / "scheduler_load.png")


def plot(steps: list[tuple[str, list[int]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = 0
    for phase, nodes in steps:
        xs = list(range(x, x + len(nodes)))
        ax.plot(xs, nodes, lw=0.8, label=phase)
        if phase == "loaded" and nodes:
            ax.axvspan(xs[0], xs[-1], color="grey", alpha=0.15)
        x += len(nodes)
    ax.set_xlabel("decoding step")
    ax.set_ylabel("tree budget chosen (nodes)")
    ax.set_title("Adaptive scheduler under load (shaded: a competing process)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
