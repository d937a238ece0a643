"""Make a shipped drafter its target's default on a class of CPU (kernels.cpu_class: amx, avx512, avx2), as a bench
run on such a CPU found it the fastest shipped one; the run's figures for it (its method there is its name, as
benchmarks/bench/generalisation.sh names them) go into its manifest. `--cpu all` moves the mark that holds on every
class without one of its own (and on GPUs).

    .venv/bin/python benchmarks/ship/default_drafter.py smollm2-135m-head --bench benchmarks/results/avx2-epyc/generalisation
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from foretell.kernels import cpu_class
from foretell.models.shipped import make_default, shipped_manifests
from ship_drafter import bench_figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a shipped drafter's name")
    p.add_argument("--bench", required=True, help="the foretell bench output folder that measured it")
    p.add_argument("--cpu", default=None,
                   help="the class of CPU the bench ran on (default: as its bench.json records, else this machine's), "
                        "or 'all' (the fallback mark)")
    args = p.parse_args()
    summary = Path(args.bench) / "bench.json"
    recorded = json.loads(summary.read_text()).get("cpu_class") if summary.is_file() else None
    cpu = args.cpu or recorded or cpu_class()
    figures = bench_figures(args.bench, args.name)
    if figures["speedup_tau"].get("overall") is None:
        raise SystemExit(f"{args.bench} has no rows of method {args.name}: run the bench with it first")
    chosen = make_default(args.name, figures, cpu=None if cpu == "all" else cpu)
    ranking = {m.name: bench_figures(args.bench, m.name)["speedup_tau"].get("overall")
               for m in shipped_manifests() if m.target == chosen.target}
    where = "everywhere without a default of its own" if cpu == "all" else f"on {cpu} CPUs"
    print(f"{chosen.name} is now the default drafter of {chosen.target.name} {where}; overall speedup, tau in "
          f"{args.bench}: " + ", ".join(f"{name} {value}" for name, value in ranking.items()))


if __name__ == "__main__":
    main()
