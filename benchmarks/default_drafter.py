"""Make a shipped drafter its target's default, as a bench run found it the fastest shipped one; the run's figures
for it (its method there is its name, as benchmarks/generalisation.sh names them) go into its manifest.

    .venv/bin/python benchmarks/default_drafter.py smollm2-135m-head --bench benchmarks/results/lean_heads/generalisation
"""

from __future__ import annotations

import argparse

from foretell.models.shipped import make_default, shipped_manifests
from ship_drafter import bench_figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a shipped drafter's name")
    p.add_argument("--bench", required=True, help="the foretell bench output folder that measured it")
    args = p.parse_args()
    figures = bench_figures(args.bench, args.name)
    if figures["speedup_tau"].get("overall") is None:
        raise SystemExit(f"{args.bench} has no rows of method {args.name}: run the bench with it first")
    chosen = make_default(args.name, figures)
    ranking = {m.name: bench_figures(args.bench, m.name)["speedup_tau"].get("overall")
               for m in shipped_manifests() if m.target == chosen.target}
    print(f"{chosen.name} is now the default drafter of {chosen.target.name}; overall speedup, tau in {args.bench}: "
          + ", ".join(f"{name} {value}" for name, value in ranking.items()))


if __name__ == "__main__":
    main()
