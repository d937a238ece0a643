"""Copy a trained drafter into src/foretell/shipped/NAME with its manifest (models/shipped.py).

    .venv/bin/python benchmarks/ship/ship_drafter.py --run runs/shipped/smollm2-head --kind parallel-head \
        --name smollm2-135m-head --target smollm2-135m --command "bash benchmarks/train/train_shipped.sh" \
        --speculative '{"method": "parallel-head", "budget": "auto", "result_cache": "prompt"}' [--default]

The manifest records the command, the training data (OUT/data/report.json), the commit, the held-out figures
(OUT/eval.json) and, with --bench DIR, that bench run's overall figures for the drafter's method.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from foretell.config import SpeculativeConfig
from foretell.models.shipped import ship_drafter
from foretell.runtime.loading import load_model

SAVED = {"parallel-head": "head", "hidden-state": "draft", "eagle3": "head"}  # the saved drafter's folder in a training run


def bench_figures(folder: str, method: str) -> dict:
    """A bench run's speedup and tau for `method`, per group (overall, each dataset and category)."""
    from foretell.bench.report import summarize
    from foretell.bench.runner import RESULTS, read_rows

    groups = summarize(read_rows(Path(folder) / RESULTS))
    return {"folder": folder, "method": method, "speedup_tau": {
        group: next(([s.speedup, s.tau] for s in rows if s.method == method), None) for group, rows in groups.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="the training run folder (its --out)")
    p.add_argument("--kind", required=True, choices=sorted(SAVED))
    p.add_argument("--name", required=True)
    p.add_argument("--target", required=True, help="the target's preset name")
    p.add_argument("--command", required=True, help="the command that made the run")
    p.add_argument("--speculative", required=True, help="the configuration it is benchmarked with (JSON, no model)")
    p.add_argument("--bench", help="a foretell bench output folder with this drafter's figures")
    p.add_argument("--bench-method", help="the method name of the drafter in that bench run")
    p.add_argument("--default", action="store_true", help="make it the target's default drafter")
    p.add_argument("--storage", default="bf16", choices=("bf16", "int8"),
                   help="int8: matrices as int8 rows with a scale each, about half the bytes (default: %(default)s)")
    args = p.parse_args()
    run = Path(args.run)
    speculative = json.loads(args.speculative)
    SpeculativeConfig.from_dict({**speculative, "model": args.name})  # checked before anything is written
    made_by = {
        "command": args.command,
        "data": json.loads((run / "data" / "report.json").read_text()),
        "data_settings": json.loads((run / "data" / "data.json").read_text()),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "heldout": json.loads((run / "eval.json").read_text()),
    }
    if args.bench:
        made_by["bench"] = bench_figures(args.bench, args.bench_method)
    target = load_model(args.target)
    out = ship_drafter(run / SAVED[args.kind], args.name, args.kind, args.target, target.model, speculative, made_by,
                       default=args.default, storage=args.storage)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"shipped {args.name}: {out} ({size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
