"""Which way of running a model decodes fastest on this CPU: the same prompts decoded plainly on each path, in turns.

    .venv/bin/python benchmarks/bench/decode_paths.py --out runs/decode_paths
    .venv/bin/python benchmarks/bench/decode_paths.py --paths bf16,gguf-q8 --speculative default

Paths (each a `load` / `foretell generate` configuration of the same GGUF file):
  bf16     `--dtype bfloat16` (the default): the file's weights as bf16 numbers, float32 activations in the lean step
  gguf     `--quant gguf --dtype float32`: the file's own blocks, float32 activations (the file's exact weights)
  gguf-q8  `--quant gguf-q8 --dtype float32`: the file's blocks, activations rounded to 8 bits before each product,
           as llama.cpp computes (a slightly different model: docs/speed.md measures what it costs in quality)
Every prompt is decoded on every path before the next prompt (the order rotating), after one warm-up prompt on each
path that is not measured. Reports tokens/s per path, the per-prompt ratio to the first path (median, geometric
mean) beside the totals, and the CPU's flags; writes OUT/results.json and OUT/report.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.kernels import cpu_class
from foretell.types import SamplingParams

PATHS = {
    "bf16": {"dtype": "bfloat16"},
    "gguf": {"dtype": "float32", "quant": "gguf"},
    "gguf-q8": {"dtype": "float32", "quant": "gguf-q8"},
}


def cpu_flags() -> list[str]:
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in wanted if f in flags]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--paths", default="bf16,gguf,gguf-q8", help=f"comma list of {', '.join(PATHS)}")
    p.add_argument("--speculative", default="none",
                   help="none (plain decoding), default (each path's default drafter) or a method name")
    p.add_argument("--datasets", default="spec-bench,gsm8k")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("runs/decode_paths") / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    paths = args.paths.split(",")
    unknown = [name for name in paths if name not in PATHS]
    if unknown:
        raise SystemExit(f"decode_paths: unknown path(s) {', '.join(unknown)}; use {', '.join(PATHS)}")
    torch.set_num_threads(args.threads)
    speculative = None if args.speculative == "default" else args.speculative
    pipes = {name: load(args.model, speculative, **PATHS[name]) for name in paths}
    prompts = load_prompts(args.datasets.split(","), args.per_category)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    for name in paths:  # warm-up, not measured
        pipes[name].engine.generate(pipes[name].encode(prompts[0]["prompt"]), params)
    rates: dict[str, list[float]] = {name: [] for name in paths}
    tokens: dict[str, int] = {name: 0 for name in paths}
    seconds: dict[str, float] = {name: 0.0 for name in paths}
    for i, prompt in enumerate(prompts):
        order = paths[i % len(paths):] + paths[:i % len(paths)]
        for name in order:
            pipe = pipes[name]
            result = pipe.engine.generate(pipe.encode(prompt["prompt"]), params)
            n, s = len(result.tokens), result.stats.total_seconds
            rates[name].append(n / s)
            tokens[name] += n
            seconds[name] += s
        print(f"[{i + 1}/{len(prompts)}] {prompt['category']}: "
              + "  ".join(f"{name} {rates[name][-1]:.1f}" for name in paths) + " tok/s", flush=True)
    base = paths[0]
    rows = []
    for name in paths:
        ratios = [a / b for a, b in zip(rates[name], rates[base])]
        rows.append({
            "path": name, "load": PATHS[name], "tokens_per_second": tokens[name] / seconds[name],
            "total_ratio": (tokens[name] / seconds[name]) / (tokens[base] / seconds[base]),
            "median_ratio": statistics.median(ratios),
            "geomean_ratio": math.exp(sum(math.log(r) for r in ratios) / len(ratios)),
            "per_prompt": rates[name],
        })
    machine = {"cpu_class": cpu_class(), "flags": cpu_flags(), "threads": args.threads}
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {"model": args.model, "speculative": args.speculative, "datasets": args.datasets,
                "per_category": args.per_category, "max_new_tokens": args.max_new_tokens}
    (args.out / "results.json").write_text(json.dumps({"machine": machine, "settings": settings, "paths": rows},
                                                      indent=1))
    lines = [f"# Decoding paths: {args.model}, {args.speculative} drafter", "",
             f"Machine: {machine['cpu_class']} ({', '.join(machine['flags'])}), {args.threads} threads. "
             f"{len(prompts)} prompts ({args.datasets}, {args.per_category} a category), {args.max_new_tokens} "
             f"tokens, greedy, paths in turns.", "",
             f"| path | load arguments | tok/s | total / {base} | median per prompt | geometric mean |",
             "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        load_args = ", ".join(f"{k}={v}" for k, v in row["load"].items())
        lines.append(f"| {row['path']} | {load_args} | {row['tokens_per_second']:.1f} | {row['total_ratio']:.3f} | "
                     f"{row['median_ratio']:.3f} | {row['geomean_ratio']:.3f} |")
    report = "\n".join(lines) + "\n"
    (args.out / "report.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
