"""Decoding speed after the prompt against llama.cpp's own `llama-bench` on the same GGUF file, taking turns.

    .venv/bin/python benchmarks/bench/decode_vs_llama_bench.py --model qwen2.5-coder-1.5b --quant gguf-q8

Each round runs `llama-bench -m FILE -n TOKENS -p 0 -t THREADS -r 1` (its tg figure: TOKENS one-token steps from
an empty context, no prompt) and foretell's plain decoding of the same number of tokens from a one-token prompt
(Pipeline.plain_engine, greedy, end tokens ignored; decode tokens/s = its one-token passes over their seconds, the
prompt pass and sampling included in neither / both as each tool counts them: llama-bench times its decode calls,
foretell its whole loop after the prompt, so sampling and the loop's Python count against foretell). The two
alternate which goes first; one warm-up round of each is not counted. This machine's noise (other tenants) moves
single figures by 10-20%, so the report gives every round's pair, the per-round ratio's median and geometric mean,
and the ratio of the medians. Writes OUT/results.json and OUT/report.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from foretell.api import load
from foretell.bench.llama_server import build_info, find_binary, missing_binary, peer_gguf
from foretell.types import SamplingParams


def llama_bench_once(binary: Path, gguf: Path, tokens: int, threads: int) -> float:
    out = subprocess.run([str(binary), "-m", str(gguf), "-n", str(tokens), "-p", "0", "-t", str(threads), "-r", "1",
                          "-o", "json"], capture_output=True, text=True, check=False)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--quant", default="gguf-q8")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("runs/decode_vs_llama_bench") / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    binary = find_binary("llama-bench")
    if binary is None:
        raise SystemExit(f"decode_vs_llama_bench: {missing_binary('llama-bench')}")
    gguf = peer_gguf(args.model)
    if gguf is None:
        raise SystemExit(f"decode_vs_llama_bench: {args.model!r} has no GGUF file for llama-bench to run")
    torch.set_num_threads(args.threads)
    print(f"loading {args.model} --quant {args.quant} --dtype {args.dtype} ...", flush=True)
    pipe = load(args.model, "none", dtype=args.dtype, quant=args.quant)
    engine = pipe.plain_engine()
    prompt_ids = pipe.encode("Write a long story about a lighthouse keeper.", chat=False)[:1]
    pairs = []
    with torch.inference_mode():
        for round_ in range(args.rounds + 1):
            first_llama = round_ % 2 == 0
            if first_llama:
                llama = llama_bench_once(binary, gguf, args.tokens, args.threads)
            mine = foretell_once(engine, prompt_ids, args.tokens)
            if not first_llama:
                llama = llama_bench_once(binary, gguf, args.tokens, args.threads)
            label = "warm-up" if round_ == 0 else f"round {round_}/{args.rounds}"
            print(f"  {label}: foretell {mine:.2f} tok/s, llama-bench {llama:.2f} tok/s, ratio {mine / llama:.3f}",
                  flush=True)
            if round_:
                pairs.append({"foretell": mine, "llama_bench": llama, "ratio": mine / llama})
    ratios = [r["ratio"] for r in pairs]
    summary = {
        "model": args.model, "quant": args.quant, "dtype": args.dtype, "tokens": args.tokens, "threads": args.threads,
        "gguf": str(gguf), "llama_build": build_info(), "rounds": pairs,
        "foretell_median": statistics.median(r["foretell"] for r in pairs),
        "llama_bench_median": statistics.median(r["llama_bench"] for r in pairs),
        "ratio_median": statistics.median(ratios),
        "ratio_geomean": math.exp(sum(math.log(r) for r in ratios) / len(ratios)),
    }
    summary["ratio_of_medians"] = summary["foretell_median"] / summary["llama_bench_median"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(summary, indent=2))
    lines = [f"# Decoding after the prompt: foretell against llama-bench ({args.model})", "",
             f"`{' '.join(sys.argv)}`", "",
             f"{args.tokens} tokens a round, {args.threads} threads, foretell `--quant {args.quant} --dtype "
             f"{args.dtype}`, llama-bench on `{gguf.name}`; the two alternate which goes first.", "",
             f"llama-bench: {build_line(summary['llama_build'])}.", "",
             "| round | foretell tok/s | llama-bench tok/s | ratio |", "|---:|---:|---:|---:|"]
    lines += [f"| {i + 1} | {r['foretell']:.2f} | {r['llama_bench']:.2f} | {r['ratio']:.3f} |"
              for i, r in enumerate(pairs)]
    lines += ["", f"Medians: foretell {summary['foretell_median']:.2f}, llama-bench {summary['llama_bench_median']:.2f} "
              f"tok/s (ratio of medians {summary['ratio_of_medians']:.3f}); per-round ratio median "
              f"{summary['ratio_median']:.3f}, geometric mean {summary['ratio_geomean']:.3f}.", ""]
    (args.out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines[-2:]))


if __name__ == "__main__":
    main()
