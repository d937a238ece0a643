"""One stream through `foretell serve` against the engine it wraps: the same prompts, weights and drafter.

    .venv/bin/python benchmarks/serve/server_vs_engine.py --flags "--quant gguf-q8 --dtype float32 --drafter none"

The server gets one closed-loop streaming chat client; the engine (foretell.api.load with the same flags, in this
process) gets the same chat-templated token ids through Pipeline.engine.generate. They take turns prompt by prompt,
alternating which goes first, each warmed up with one short request first. A request's time is the whole request
(prefill included: for the server, from sending it to [DONE]), as `foretell bench` times a run. Reports both
tokens/s, the per-prompt ratio server / engine (median and geometric mean) and the total ratio; writes
OUT/results.json and OUT/report.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import Server, one_request  # noqa: E402  (a sibling script)

from foretell.bench.datasets import load_prompts


def serve_once(url: str, prompt: str, max_tokens: int) -> tuple[int, float]:
    async def go():
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
            start = time.perf_counter()
            out = await one_request(client, url, "m", prompt, max_tokens, None)
            return out, time.perf_counter() - start

    out, seconds = asyncio.run(go())
    if out.status != "ok":
        raise SystemExit(f"server_vs_engine: the server failed a request: {out.error}")
    return out.tokens, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--flags", default="--quant gguf-q8 --dtype float32 --drafter none",
                   help="`foretell serve` / `foretell generate` flags of both (default: %(default)s)")
    p.add_argument("--datasets", default="spec-bench")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("runs/server_vs_engine") / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    import torch

    from foretell.api import load
    from foretell.cli import build_parser
    from foretell.spec_args import speculative_from_args
    from foretell.text import encode_prompt
    from foretell.types import SamplingParams

    args.out.mkdir(parents=True, exist_ok=True)
    flags = shlex.split(args.flags)
    gen = build_parser().parse_args(["generate", "x", "--model", args.model, *flags])
    spec, _ = speculative_from_args(gen, args.model)
    torch.set_num_threads(args.threads)
    pipe = load(args.model, spec, dtype=gen.dtype, quant=gen.quant)
    tokenizer = pipe.target.tokenizer
    prompts = load_prompts(args.datasets.split(","), args.per_category)
    server_args = argparse.Namespace(model=args.model, dtype=gen.dtype, threads=args.threads)
    server = Server("foretell", server_args, flags, args.out / "server.log")
    params = SamplingParams(max_new_tokens=args.max_tokens)

    def engine_once(text: str) -> tuple[int, float]:
        ids = encode_prompt(tokenizer, text, chat=True)
        if pipe.engine.result_cache is not None:  # earlier answers to this prompt would be free tokens
            pipe.engine.result_cache.clear()
        start = time.perf_counter()
        tokens = len(pipe.engine.generate(ids, params).tokens)
        return tokens, time.perf_counter() - start

    rows = []
    try:
        serve_once(server.url, prompts[0]["prompt"], 8)  # warm-ups
        pipe.engine.generate(encode_prompt(tokenizer, prompts[0]["prompt"], chat=True), SamplingParams(max_new_tokens=8))
        for i, prompt in enumerate(prompts):
            order = ("server", "engine") if i % 2 == 0 else ("engine", "server")
            got = {}
            for who in order:
                got[who] = serve_once(server.url, prompt["prompt"], args.max_tokens) if who == "server" else \
                    engine_once(prompt["prompt"])
            row = {"dataset": prompt["dataset"], "id": prompt["id"], "category": prompt.get("category"),
                   **{f"{who}_tokens": n for who, (n, _) in got.items()},
                   **{f"{who}_seconds": round(s, 4) for who, (_, s) in got.items()}}
            row["ratio"] = round((got["server"][0] / got["server"][1]) / (got["engine"][0] / got["engine"][1]), 4)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        server.stop()
    rates = {who: sum(r[f"{who}_tokens"] for r in rows) / sum(r[f"{who}_seconds"] for r in rows)
             for who in ("server", "engine")}
    ratios = [r["ratio"] for r in rows]
    summary = {"model": args.model, "flags": args.flags, "prompts": len(rows), "max_tokens": args.max_tokens,
               "server_tokens_per_second": round(rates["server"], 2),
               "engine_tokens_per_second": round(rates["engine"], 2),
               "total_ratio": round(rates["server"] / rates["engine"], 3),
               "median_ratio": round(statistics.median(ratios), 3),
               "geomean_ratio": round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 3)}
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    report = (f"{args.model} `{args.flags}`, {len(rows)} prompts ({args.datasets}, {args.per_category} a category), "
              f"{args.max_tokens} tokens, greedy, {args.threads} threads: server {summary['server_tokens_per_second']} "
              f"tok/s, engine {summary['engine_tokens_per_second']} tok/s; server / engine total "
              f"{summary['total_ratio']:.3f}, per prompt median {summary['median_ratio']:.3f}, geometric mean "
              f"{summary['geomean_ratio']:.3f}\n")
    (args.out / "report.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
