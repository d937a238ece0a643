"""Decoding speed after the prompt against llama.cpp's own `llama-bench` on the same GGUF file, taking turns.

    .venv/bin/python benchmarks/bench/decode_vs_llama_bench.py --model qwen2.5-coder-1.5b --quant gguf-q8

Plain decoding on both sides: llama-bench has no speculative mode, so llama.cpp's drafting configurations (n-gram,
`-md` with its draft sweep) are measured by `foretell bench --methods ...,llama-cpp-all` and serve_batching.py; here
llama.cpp's side is llama-bench in each configuration of LLAMA_BENCH_CONFIGS (its defaults, and flash attention on),
foretell's is its plain decoding. Each round runs every llama-bench configuration as
`llama-bench -m FILE -n TOKENS -p 0 -t THREADS -r 1 [FLAGS]` (a fresh process each time; its tg figure: TOKENS
one-token steps from an empty context, no prompt) and foretell's plain decoding of the same number of tokens from a
one-token prompt (Pipeline.plain_engine, greedy, end tokens ignored; decode tokens/s = its one-token passes over their seconds, the
prompt pass and sampling included in neither / both as each tool counts them: llama-bench times its decode calls,
foretell its whole loop after the prompt, so sampling and the loop's Python count against foretell). The order
rotates from round to round; one warm-up round of each is not counted (plain decoding keeps no cache, so nothing
carries from one round to the next). This machine's noise (other tenants) moves single figures by 10-20%, so the
report gives every round's figures, each configuration's median over the rounds (--rounds, at least 3), each side's
best by median and foretell / llama-bench's best, and the per-round paired ratio against each llama-bench
configuration (median and geometric mean). Writes OUT/results.json (the llama-bench command lines and the build's
cmake flags included) and OUT/report.md.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from foretell.api import load
from foretell.bench.best import best_by_level, best_ratio, markdown, median_by_config
from foretell.bench.llama_server import build_info, find_binary, missing_binary, peer_gguf
from foretell.types import SamplingParams

# llama-bench's configurations for decoding, in one place: name -> a function of its --help text giving the flags
# (flash attention's values are spelt 0/1 in some llama.cpp versions, on/off in others).
LLAMA_BENCH_CONFIGS = {
    "llama-bench": lambda help_text: [],
    "llama-bench-fa": lambda help_text: ["-fa", "on" if re.search(r"-fa.*\bon\b", help_text) else "1"],
}


def llama_bench_command(binary: Path, gguf: Path, tokens: int, threads: int, flags: list[str]) -> list[str]:
    return [str(binary), "-m", str(gguf), "-n", str(tokens), "-p", "0", "-t", str(threads), "-r", "1", "-o", "json",
            *flags]


def llama_bench_once(command: list[str]) -> float:
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"decode_vs_llama_bench: llama-bench failed ({out.returncode}): {out.stderr[-400:]}")
    rows = json.loads(out.stdout)
    return float(rows[0]["avg_ts"])


def foretell_once(engine, prompt_ids: list[int], tokens: int) -> float:
    result = engine.generate(prompt_ids, SamplingParams(max_new_tokens=tokens + 1, ignore_eos=True))
    stats = result.stats
    return stats.target_passes / stats.decode_seconds


def build_line(build: dict) -> str:
    """The llama.cpp build in words, with the cmake flags the install script recorded."""
    if not build:
        return "build not recorded (not installed by scripts/install_llama_cpp.sh)"
    return (f"{build.get('build', 'unknown')} build of llama-cpp-python {build.get('version', '?')}'s llama.cpp "
            f"({' '.join(build.get('cmake_flags', []))})")


def round_order(names: list[str], round_: int) -> list[str]:
    """The round's order: rotated by one each round, so no configuration always goes first."""
    shift = round_ % len(names)
    return names[shift:] + names[:shift]


def summarize_rounds(rounds: list[dict], llama_names: list[str]) -> dict:
    """Medians, each side's best, and per-round paired ratios (foretell over each llama-bench configuration)."""
    rows = [{"config": name, "level": "decode", "side": "foretell" if name == "foretell" else "llama.cpp",
             "tok/s": r[name]} for r in rounds for name in ["foretell", *llama_names]]
    entries = median_by_config(rows, "tok/s")
    best = best_by_level(entries)["decode"]
    paired = {}
    for name in llama_names:
        ratios = [r["foretell"] / r[name] for r in rounds]
        paired[name] = {"ratio_median": statistics.median(ratios),
                        "ratio_geomean": math.exp(sum(math.log(x) for x in ratios) / len(ratios))}
    return {"medians": {e["config"]: e["median"] for e in entries}, "entries": entries,
            "best": {side: e["config"] for side, e in best.items()},
            "best_ratio": best_ratio(best_by_level(entries), "foretell", "llama.cpp")["decode"]["ratio"],
            "paired": paired}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--quant", default="gguf-q8")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7, help="counted rounds, at least 3 (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", default=",".join(LLAMA_BENCH_CONFIGS),
                   help="llama-bench configurations (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("runs/decode_vs_llama_bench") / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    if args.rounds < 3:
        raise SystemExit("decode_vs_llama_bench: --rounds must be at least 3 (each configuration's figure is a median)")
    llama_names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = sorted(set(llama_names) - set(LLAMA_BENCH_CONFIGS))
    if unknown or not llama_names:
        raise SystemExit(f"decode_vs_llama_bench: unknown --configs {', '.join(unknown)}; use "
                         f"{', '.join(LLAMA_BENCH_CONFIGS)}")
    binary = find_binary("llama-bench")
    if binary is None:
        raise SystemExit(f"decode_vs_llama_bench: {missing_binary('llama-bench')}")
    gguf = peer_gguf(args.model)
    if gguf is None:
        raise SystemExit(f"decode_vs_llama_bench: {args.model!r} has no GGUF file for llama-bench to run")
    help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, check=False)
    help_text = help_text.stdout + help_text.stderr
    commands = {name: llama_bench_command(binary, gguf, args.tokens, args.threads, LLAMA_BENCH_CONFIGS[name](help_text))
                for name in llama_names}
    torch.set_num_threads(args.threads)
    print(f"loading {args.model} --quant {args.quant} --dtype {args.dtype} ...", flush=True)
    pipe = load(args.model, "none", dtype=args.dtype, quant=args.quant)
    engine = pipe.plain_engine()
    prompt_ids = pipe.encode("Write a long story about a lighthouse keeper.", chat=False)[:1]
    rounds = []
    with torch.inference_mode():
        for round_ in range(args.rounds + 1):
            figures = {}
            for name in round_order(["foretell", *llama_names], round_):
                figures[name] = (foretell_once(engine, prompt_ids, args.tokens) if name == "foretell"
                                 else llama_bench_once(commands[name]))
            label = "warm-up" if round_ == 0 else f"round {round_}/{args.rounds}"
            print(f"  {label}: " + ", ".join(f"{n} {v:.2f} tok/s" for n, v in figures.items()), flush=True)
            if round_:
                rounds.append(figures)
    result = summarize_rounds(rounds, llama_names)
    default = llama_names[0]
    summary = {
        "model": args.model, "quant": args.quant, "dtype": args.dtype, "tokens": args.tokens, "threads": args.threads,
        "gguf": str(gguf), "llama_build": build_info(), "llama_bench_commands": {n: c[1:] for n, c in commands.items()},
        "rounds": rounds, "medians": result["medians"], "best": result["best"],
        "best_ratio": result["best_ratio"], "paired": result["paired"],
        # against the first configuration (llama-bench's defaults), as the earlier reports gave them
        "foretell_median": result["medians"]["foretell"], "llama_bench_median": result["medians"][default],
        "ratio_median": result["paired"][default]["ratio_median"],
        "ratio_geomean": result["paired"][default]["ratio_geomean"],
    }
    summary["ratio_of_medians"] = summary["foretell_median"] / summary["llama_bench_median"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(summary, indent=2))
    lines = [f"# Decoding after the prompt: foretell against llama-bench ({args.model})", "",
             f"`{' '.join(sys.argv)}`", "",
             f"{args.tokens} tokens a round, {args.threads} threads, foretell `--quant {args.quant} --dtype "
             f"{args.dtype}` (plain decoding), llama-bench on `{gguf.name}` in each configuration; the order rotates "
             "from round to round.", "",
             f"llama-bench: {build_line(summary['llama_build'])}. Configurations:", ""]
    lines += [f"- {n}: `llama-bench {' '.join(c[1:])}`" for n, c in commands.items()]
    lines += ["", "| round | " + " | ".join(["foretell", *llama_names]) + " |", "|---:|" + "---:|" * (1 + len(llama_names))]
    lines += [f"| {i + 1} | " + " | ".join(f"{r[n]:.2f}" for n in ["foretell", *llama_names]) + " |"
              for i, r in enumerate(rounds)]
    lines += ["", "Each side at its best (tok/s, median of the rounds):", ""]
    lines += markdown(result["entries"], "foretell", "llama.cpp", unit="tok/s", level_name="level")
    lines += ["", "Per-round paired ratio foretell / each llama-bench configuration: " + "; ".join(
        f"{n}: median {v['ratio_median']:.3f}, geometric mean {v['ratio_geomean']:.3f}"
        for n, v in result["paired"].items()) + ".", ""]
    (args.out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines[-12:]))


if __name__ == "__main__":
    main()
