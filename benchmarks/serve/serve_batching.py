"""Serving throughput with batching: plain batched vs speculative batched (foretell's batch-aware budget) vs the
fixed-by-batch-size rule, and llama.cpp's own llama-server on the same GGUF file, in one run.

    .venv/bin/python benchmarks/serve/serve_batching.py --out runs/serve_batching [--drafter "--drafter prompt-lookup"]

At each concurrency level (1, 4, 16 closed-loop streaming chat clients, greedy, Spec-Bench prompts) every server
serves the same requests, the servers taking turns level by level so all see the same machine. Reports total
tokens/s and per-request latency (time to first token, inter-token latency, end to end) and the ratios the
batching issue asks for. Before the servers, an in-process check: the batching engine with one request against
the single-request engine, same drafter, same prompts, interleaved. Writes OUT/results.json, OUT/report.md,
OUT/serve_batching.png.

llama.cpp's rows: the native llama-server (bash scripts/install_llama_cpp.sh builds it), restarted per level with
-np = that level's clients (each client its own slot, decoded together), plain and with --spec-type ngram-simple
(llama.cpp's n-gram drafting from the context, its default sizes); the chat template is the GGUF's own, as
foretell's. results.json records the build and command lines. Only some servers: --servers
llama-server,llama-server-ngram (a quick look: --clients 1 --requests 2).

Prompt caches: off by default on both sides (foretell's `--prefix-cache-mb 0`, llama-server's `--no-cache-prompt
--cache-ram 0`), so every request reads its whole prompt and the run measures batching itself. --prompt-cache keeps
both servers' defaults (foretell's prefix cache, llama-server's per-slot `cache_prompt` and RAM cache); then every
server is restarted per level and warmed up on Spec-Bench prompts outside the measured ones, so no cache starts
with a measured prompt, and a prompt is reused within a level only (the load sends each prompt several times).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import Server, plot, run_level, summarize  # noqa: E402  (a sibling script)

from foretell.bench.datasets import load_prompts  # noqa: E402
from foretell.bench.llama_server import LlamaServer, ServerConfig, build_info, find_binary, missing_binary  # noqa: E402
from foretell.errors import ForetellError  # noqa: E402

# row name -> `foretell serve` flags (after --dtype, so a row's own --dtype wins). The GGUF's Q4_1 blocks with 8-bit
# activations are llama.cpp's arithmetic on the same file; "DRAFTER" becomes --drafter's flags (none: the target's
# default drafter); "fixed-by-batch-size" is vLLM's rule as the reference for foretell's batch-aware budget.
Q8 = ["--quant", "gguf-q8", "--dtype", "float32"]
FORETELL_SERVERS = {
    "plain": [*Q8, "--drafter", "none"],
    "speculative": [*Q8, "DRAFTER", "--batch-budget", "auto"],
    "speculative-bf16": ["--dtype", "bfloat16", "DRAFTER", "--batch-budget", "auto"],
    "fixed-by-batch-size": [*Q8, "DRAFTER", "--batch-budget", "fixed"],
}
NO_PREFIX_CACHE = ["--prefix-cache-mb", "0"]
LLAMA_SERVERS = {"llama-server": None, "llama-server-ngram": "ngram-simple"}  # row name -> --spec-type


def llama_server_starter(args, spec_type: str | None):
    """start(clients, log) -> a running llama-server with one slot per client; None when it cannot run."""
    binary = find_binary("llama-server")
    if binary is None:
        print(f"serve_batching: no llama.cpp rows: {missing_binary('llama-server')}", file=sys.stderr)
        return None
    from foretell.bench.llama_server import peer_gguf

    gguf = peer_gguf(args.model)
    if gguf is None:
        print(f"serve_batching: no llama.cpp rows: no GGUF file on disk for {args.model!r}", file=sys.stderr)
        return None

    def start(clients: int, log: Path) -> LlamaServer:
        try:
            return LlamaServer(binary, ServerConfig(gguf, threads=args.threads, slots=clients,
                                                    slot_context=args.slot_context, spec_type=spec_type,
                                                    prompt_cache=args.prompt_cache), log=log)
        except ForetellError as e:
            raise SystemExit(f"serve_batching: {e}") from None

    return start


def single_vs_batch(model: str, drafter_flags: list[str], prompts: list[str], max_tokens: int, threads: int) -> dict:
    """Tokens/s of the single-request engine and of the batching engine serving one request at a time."""
    import torch

    from foretell.api import load
    from foretell.cli import build_parser
    from foretell.spec_args import speculative_from_args
    from foretell.types import SamplingParams

    torch.set_num_threads(threads)
    spec, _ = speculative_from_args(build_parser().parse_args(["generate", "x", *drafter_flags]), model)
    pipe = load(model, spec, dtype="bfloat16")
    batch = pipe.batch_engine(max_batch=1)
    params = SamplingParams(max_new_tokens=max_tokens)

    def fail(error: Exception) -> None:
        raise error

    totals = {"single": [0, 0.0], "batched": [0, 0.0]}
    for i, text in enumerate(prompts):
        ids = pipe.encode(text)
        pipe.engine.generate(ids, params)  # untimed: a prompt's first pass builds kernels for its shapes
        for name in ("single", "batched") if i % 2 == 0 else ("batched", "single"):  # neither always goes first
            start = time.perf_counter()
            if name == "single":
                if pipe.engine.result_cache is not None:  # its earlier answers to this very prompt would be free tokens
                    pipe.engine.result_cache.clear()
                tokens = len(pipe.engine.generate(ids, params).tokens)
            else:
                got: list[int] = []
                batch.submit(ids, params, lambda c: got.extend(c.tokens), fail)
                batch.run()
                tokens = len(got)
            totals[name][0] += tokens
            totals[name][1] += time.perf_counter() - start
    rates = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    return {"single_tokens_per_second": round(rates["single"], 2), "batched_tokens_per_second": round(rates["batched"], 2),
            "ratio": round(rates["batched"] / rates["single"], 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2, help="threads of every server (default: %(default)s)")
    p.add_argument("--drafter", default="",
                   help="the speculative servers' drafter flags, e.g. \"--drafter prompt-lookup\" (default: none, the "
                   "target's default drafter)")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", default="12,24,48", help="requests per level and server (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--per-category", type=int, default=4)
    p.add_argument("--single-prompts", type=int, default=8, help="prompts of the in-process check (0 = skip)")
    p.add_argument("--servers", default=",".join([*FORETELL_SERVERS, *LLAMA_SERVERS]),
                   help="which servers to run (default: %(default)s)")
    p.add_argument("--no-llama-cpp", action="store_true", help="drop the llama-server rows")
    p.add_argument("--prompt-cache", action="store_true",
                   help="keep both servers' prompt caches on, as they start by default (servers restarted per level, "
                   "warmed up on other prompts)")
    p.add_argument("--slot-context", type=int, default=4096, help="llama-server's KV tokens per slot (default: "
                   "%(default)s)")
    p.add_argument("--prefill-chunk", type=int,
                   help="prompt tokens a pass of every foretell server (default: the server's own default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/serve_batching") / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    chosen = [name.strip() for name in args.servers.split(",") if name.strip()]
    unknown = sorted(set(chosen) - {*FORETELL_SERVERS, *LLAMA_SERVERS})
    if unknown:
        known = ", ".join([*FORETELL_SERVERS, *LLAMA_SERVERS])
        raise SystemExit(f"unknown --servers {', '.join(unknown)}; use {known}")
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = [row["prompt"] for row in load_prompts(["spec-bench"], args.per_category)]
    others = [row["prompt"] for row in load_prompts(["spec-bench"], 2 * args.per_category) if row["prompt"] not in prompts]
    random.Random(args.seed).shuffle(prompts)
    warm_prompts = others if args.prompt_cache else prompts  # a warm-up must not fill a cache with measured prompts
    drafter = args.drafter.split()
    results: dict = {"settings": {k: str(v) for k, v in vars(args).items()}, "levels": []}
    if args.single_prompts:
        results["single_vs_batched"] = single_vs_batch(args.model, drafter, prompts[: args.single_prompts],
                                                       args.max_tokens, args.threads)
        print(json.dumps(results["single_vs_batched"]), file=sys.stderr)

    args.leave_share = 0.0
    def flags(name: str) -> list[str]:
        cache = [] if args.prompt_cache else NO_PREFIX_CACHE
        chunk = ["--prefill-chunk", str(args.prefill_chunk)] if args.prefill_chunk else []
        return [f for flag in FORETELL_SERVERS[name] for f in (drafter if flag == "DRAFTER" else [flag])] + cache + chunk

    def start_foretell(name: str, log: Path) -> Server:
        server = Server(name, args, flags(name), log)
        asyncio.run(run_level(server.url, "m", warm_prompts, len(warm_prompts), 1, 8, 0.0, random.Random(0)))
        return server  # warmed up: every warm-up prompt once

    names = [name for name in FORETELL_SERVERS if name in chosen]
    servers: dict[str, Server] = {} if args.prompt_cache else {
        name: start_foretell(name, args.out / f"server-{name}.log") for name in names}
    starters = {} if args.no_llama_cpp else {name: llama_server_starter(args, spec) for name, spec in
                                             LLAMA_SERVERS.items() if name in chosen}
    starters = {name: start for name, start in starters.items() if start is not None}
    if starters:
        results["llama_cpp"] = {"build": build_info(), "commands": {}}
    results["settings"]["servers"] = {name: " ".join(flags(name)) for name in names}
    try:
        for clients, count in zip([int(c) for c in args.clients.split(",")],
                                  [int(n) for n in args.requests.split(",")]):
            for name in names:  # with prompt caches: a fresh server per level, as llama-server's
                server = servers.get(name) or start_foretell(name, args.out / f"server-{name}-{clients}.log")
                try:
                    outcomes, wall = asyncio.run(run_level(server.url, "m", prompts, count, clients, args.max_tokens,
                                                           0.0, random.Random(args.seed + clients)))
                finally:
                    if args.prompt_cache:
                        server.stop()
                row = summarize(name, clients, outcomes, wall)
                results["levels"].append(row)
                print(json.dumps(row), file=sys.stderr)
            for name, start in starters.items():  # restarted per level: -np follows the clients
                with start(clients, args.out / f"server-{name}-{clients}.log") as server:
                    results["llama_cpp"]["commands"][f"{name} x{clients}"] = " ".join(server.command)
                    # warm-up: a round of short requests (nothing to compile, but first touches of the weights)
                    asyncio.run(run_level(server.url, "m", warm_prompts, clients, clients, 8, 0.0, random.Random(0)))
                    outcomes, wall = asyncio.run(run_level(server.url, "m", prompts, count, clients, args.max_tokens,
                                                           0.0, random.Random(args.seed + clients)))
                row = summarize(name, clients, outcomes, wall)
                results["levels"].append(row)
                print(json.dumps(row), file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
    results["ratios"] = ratios(results["levels"])
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_report(args.out, results)
    plot(args.out, results)
    (args.out / "serve_load.png").rename(args.out / "serve_batching.png")
    print((args.out / "report.md").read_text())


def ratios(levels: list[dict]) -> dict:
    """Per concurrency: each server's total tokens/s over plain batched decoding's, and foretell's best over
    each llama-server's."""
    out = {}
    for clients in sorted({r["clients"] for r in levels}):
        rate = {r["server"]: r["tokens_per_second"] for r in levels if r["clients"] == clients}
        row = {f"{name} / plain": round(v / rate["plain"], 3) for name, v in rate.items()
               if name != "plain" and "plain" in rate}
        foretell = [v for name, v in rate.items() if name not in LLAMA_SERVERS]
        for name in LLAMA_SERVERS:
            if foretell and rate.get(name):
                row[f"foretell best / {name}"] = round(max(foretell) / rate[name], 3)
        out[clients] = row
    return out


def write_report(out: Path, results: dict) -> None:
    lines = []
    if "single_vs_batched" in results:
        s = results["single_vs_batched"]
        lines += [f"One request at a time, in process: single-request engine {s['single_tokens_per_second']} tok/s, "
                  f"batching engine {s['batched_tokens_per_second']} tok/s ({s['ratio']:.3f}x).", ""]
    lines += ["| server | clients | served | failed | tokens/s | TTFT p50 / p90 (s) | ITL p50 / p90 / p99 (ms) | tau |",
              "|---|" + "---:|" * 7]
    for r in results["levels"]:
        ttft = f"{r['ttft_p50']:.2f} / {r['ttft_p90']:.2f}" if r["ttft_p50"] is not None else "–"
        itl = (" / ".join(f"{1000 * r[k]:.0f}" for k in ("itl_p50", "itl_p90", "itl_p99"))
               if r["itl_p50"] is not None else "–")
        tau = f"{r['mean_acceptance_length']:.2f}" if r["mean_acceptance_length"] else "–"
        lines.append(f"| {r['server']} | {r['clients']} | {r['served']} | {r['failed']} | {r['tokens_per_second']:.1f} "
                     f"| {ttft} | {itl} | {tau} |")
    columns = list(next(iter(results["ratios"].values()), {}))
    if columns:
        lines += ["", "| clients | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
        for clients, row in results["ratios"].items():
            lines.append(f"| {clients} | " + " | ".join(f"{row[c]:.3f}" if c in row else "–" for c in columns) + " |")
    cached = results["settings"].get("prompt_cache") == "True"
    lines += ["", "Prompt caches: " + ("on, as both servers start (foretell's prefix cache, llama-server's cache_prompt); "
                                       "servers restarted per level, warmed up on other prompts." if cached else
                                       "off on both sides (--prefix-cache-mb 0, --no-cache-prompt): every request reads "
                                       "its whole prompt.")]
    if "llama_cpp" in results:
        build = results["llama_cpp"]["build"]
        lines += ["", f"llama-server: {build.get('build', 'unknown')} build of llama-cpp-python "
                      f"{build.get('version', '?')}'s llama.cpp ({' '.join(build.get('cmake_flags', []))})."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
