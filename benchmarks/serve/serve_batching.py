"""Serving throughput with batching: foretell's servers (plain batched, speculative batched with foretell's
batch-aware budget, the fixed-by-batch-size rule) against llama.cpp's own llama-server on the same GGUF file, each
side in every configuration it has, each at its best.

    .venv/bin/python benchmarks/serve/serve_batching.py --out runs/serve_batching [--drafter "--drafter prompt-lookup"]
        [--draft qwen2.5-coder-0.5b]   # llama-server's -md configurations (a GGUF preset or file; without it, none)

At each concurrency level (1, 4, 16 closed-loop streaming chat clients, greedy, Spec-Bench prompts) every
configuration serves the same requests, --runs times (default 3). Every (level, run, configuration) gets a fresh
server process, warmed up on Spec-Bench prompts outside the measured set, then measured; the configurations take
turns in an order that rotates from run to run, so all see the same machine. A configuration's figure at a level
is the median of its runs' total tokens/s; each side's best at a level is its configuration with the highest median,
and the headline ratio is foretell's best over llama.cpp's best (foretell/bench/best.py). Per-request latency (time
to first token, inter-token latency) is that of the median run. Before the servers, an in-process check: the
batching engine with one request against the single-request engine, same drafter, same prompts, interleaved.
Writes OUT/results.json (every run of every configuration), OUT/report.md, OUT/serve_batching.png.

llama.cpp's configurations are foretell.bench.llama_server.PEER_CONFIGS: plain (row `llama-server`), n-gram
drafting from the context (`llama-server-ngram`: --spec-type ngram-simple) and, with --draft, `-md DRAFT` at
llama.cpp's defaults and a small sweep of draft length / minimum / probability floor (`llama-server-draft*`), the
flags spelt as the installed llama-server's --help spells them. Each runs with -np = the level's clients (each client
its own slot, decoded together); the chat template is the GGUF's own, as foretell's. results.json records the
build (the install script's cmake flags) and every command line. Only some servers: --servers
plain,speculative,llama-server,llama-server-ngram (a quick look: --clients 1 --requests 2 --runs 1).

Caches that carry answers across requests are off on both sides by default: foretell's prefix cache
(`--prefix-cache-mb 0`) and result cache (the speculative servers run their drafter's configuration with
result_cache off, and without a corpus, which would turn it on, from a --spec-config file), llama-server's
prompt cache (`--no-cache-prompt --cache-ram 0`). --caches turns both sides' on, as each server starts by default,
and the report says so; measured prompts still never reach a cache before they are measured (fresh processes,
warm-up on other prompts), but the load sends each prompt several times within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import Server, plot, run_level, summarize  # noqa: E402  (a sibling script)

from foretell.bench.best import best_by_level, best_ratio, markdown, median_by_config  # noqa: E402
from foretell.bench.datasets import load_prompts
from foretell.bench.llama_server import (PEER_CONFIGS, LlamaServer, build_info, find_binary,  # noqa: E402
                                         missing_binary, peer_gguf)
from foretell.errors import ForetellError  # noqa: E402

# row name -> `foretell serve` flags (after --dtype, so a row's own --dtype wins). The GGUF's Q4_1 blocks with 8-bit
# activations are llama.cpp's arithmetic on the same file; "DRAFTER" becomes --drafter's flags (none: the target's
# default drafter; with caches off, a --spec-config file of that drafter with its result cache off);
# "fixed-by-batch-size" is vLLM's rule as the reference for foretell's batch-aware budget.
Q8 = ["--quant", "gguf-q8", "--dtype", "float32"]
FORETELL_SERVERS = {
    "plain": [*Q8, "--drafter", "none"],
    "speculative": [*Q8, "DRAFTER", "--batch-budget", "auto"],
    "speculative-bf16": ["--dtype", "bfloat16", "DRAFTER", "--batch-budget", "auto"],
    "fixed-by-batch-size": [*Q8, "DRAFTER", "--batch-budget", "fixed"],
}
NO_PREFIX_CACHE = ["--prefix-cache-mb", "0"]
FORETELL, LLAMA = "foretell", "llama.cpp"  # the two sides
# row name -> llama.cpp configuration (llama_server.PEER_CONFIGS, listed there)
LLAMA_SERVERS = {"llama-server" if c.name == "plain" else f"llama-server-{c.name}": c for c in PEER_CONFIGS}
WARMUP_TOKENS = 8


def split_prompts(per_category: int, seed: int) -> tuple[list[str], list[str]]:
    """The measured Spec-Bench prompts (per_category a category, shuffled) and the warm-up prompts: the next
    per_category of each category, none of them measured, so no server's cache meets a measured prompt before it
    is measured."""
    prompts = [row["prompt"] for row in load_prompts(["spec-bench"], per_category)]
    warm = [row["prompt"] for row in load_prompts(["spec-bench"], 2 * per_category) if row["prompt"] not in prompts]
    if not warm:
        raise SystemExit("serve_batching: Spec-Bench has no prompts left over for the warm-up; lower --per-category")
    random.Random(seed).shuffle(prompts)
    return prompts, warm


def foretell_drafter_flags(model: str, drafter: list[str], caches: bool, out: Path) -> tuple[list[str], str]:
    """The flags the speculative rows put for DRAFTER, and the configuration in words. With caches off and a drafter
    whose configuration keeps a result cache (the shipped drafters' result_cache: prompt, or a corpus, which turns
    one on), that configuration without it, as a --spec-config file in `out`: earlier requests' outputs must not
    draft later ones. (A corpus is fixed before the run, but the result cache it rides on stores every output.)"""
    from foretell.cli import build_parser
    from foretell.spec_args import speculative_from_args

    spec, _ = speculative_from_args(build_parser().parse_args(["generate", "x", *drafter]), model)
    if caches or (spec.result_cache is None and spec.corpus is None):
        return drafter, spec.describe()
    dropped = [what for what, on in (("result cache", spec.result_cache), (f"corpus {spec.corpus}", spec.corpus)) if on]
    spec = replace(spec, result_cache=None, corpus=None)
    path = spec.save(out / "spec-no-result-cache.json")
    return ["--spec-config", str(path)], f"{spec.describe()} (its {' and '.join(dropped)} off: caches off)"


def llama_starter(args, cfg, draft: Path | None):
    """start(clients, log) -> a running llama-server in configuration `cfg` with one slot per client; a string
    saying why when it cannot run."""
    binary = find_binary("llama-server")
    if binary is None:
        return missing_binary("llama-server")
    gguf = peer_gguf(args.model)
    if gguf is None:
        return f"no GGUF file on disk for {args.model!r}"
    if cfg.draft and draft is None:
        return "no draft model (--draft) for -md"

    def start(clients: int, log: Path) -> LlamaServer:
        try:
            return LlamaServer(binary, cfg.server_config(gguf, draft, threads=args.threads, slots=clients,
                                                         slot_context=args.slot_context, prompt_cache=args.caches),
                               log=log)
        except ForetellError as e:
            raise SystemExit(f"serve_batching: {e}") from None

    return start


def measure(levels: list[tuple[int, int]], runs: int, starters: dict, prompts: list[str], warm: list[str],
            max_tokens: int, seed: int, out: Path, load=None) -> list[dict]:
    """Every (level, run, server): a fresh server from starters[name](clients, log), a warm-up on `warm` (short
    requests at the level's concurrency), then the level's requests over `prompts`; the server stopped before the
    next one starts. The servers' order rotates with the run. Returns one row per measurement (summarize's, with
    run and command). `load(url, prompts, requests, clients, max_tokens, rng)` -> (outcomes, wall) is the client
    load (default: serve_load's streaming chat clients)."""
    if load is None:
        def load(url, texts, requests, clients, tokens, rng):
            return asyncio.run(run_level(url, "m", texts, requests, clients, tokens, 0.0, rng))
    names, rows = list(starters), []
    for clients, count in levels:
        for run in range(runs):
            shift = run % len(names)
            for name in names[shift:] + names[:shift]:
                server = starters[name](clients, out / f"server-{name}-{clients}-run{run}.log")
                try:
                    load(server.url, warm, max(len(warm), clients), clients, WARMUP_TOKENS, random.Random(run))
                    outcomes, wall = load(server.url, prompts, count, clients, max_tokens,
                                          random.Random(seed + clients))
                    command = server.command if isinstance(server.command, str) else " ".join(server.command)
                finally:
                    server.stop()
                row = {**summarize(name, clients, outcomes, wall), "run": run, "command": command}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "command"}), file=sys.stderr)
    return rows


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
    p.add_argument("--draft", help="draft model for llama-server's -md configurations (a GGUF preset or file; "
                   "default: none, so no -md rows)")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", default="12,24,48", help="requests per level, server and run (default: %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="runs of every configuration at every level, each on a fresh "
                   "server; a configuration's figure is their median (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--per-category", type=int, default=4)
    p.add_argument("--single-prompts", type=int, default=8, help="prompts of the in-process check (0 = skip)")
    p.add_argument("--servers", default=",".join([*FORETELL_SERVERS, *LLAMA_SERVERS]),
                   help="which servers to run (default: %(default)s; the -md ones need --draft)")
    p.add_argument("--no-llama-cpp", action="store_true", help="drop the llama-server rows")
    p.add_argument("--caches", "--prompt-cache", action="store_true", dest="caches",
                   help="both sides' caches on, as their servers start by default (foretell's prefix and result "
                   "caches, llama-server's prompt cache); default: off on both sides")
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
    if args.runs < 1:
        raise SystemExit(f"--runs must be >= 1, got {args.runs}")
    levels = list(zip([int(c) for c in args.clients.split(",")], [int(n) for n in args.requests.split(",")]))
    args.out.mkdir(parents=True, exist_ok=True)
    prompts, warm = split_prompts(args.per_category, args.seed)
    drafter = args.drafter.split()
    results: dict = {"settings": {k: str(v) for k, v in vars(args).items()}, "caches": args.caches}
    if args.single_prompts:
        results["single_vs_batched"] = single_vs_batch(args.model, drafter, prompts[: args.single_prompts],
                                                       args.max_tokens, args.threads)
        print(json.dumps(results["single_vs_batched"]), file=sys.stderr)

    args.leave_share = 0.0
    names = [name for name in FORETELL_SERVERS if name in chosen]
    drafter_flags, drafter_config = foretell_drafter_flags(args.model, drafter, args.caches, args.out)

    def flags(name: str) -> list[str]:
        cache = [] if args.caches else NO_PREFIX_CACHE
        chunk = ["--prefill-chunk", str(args.prefill_chunk)] if args.prefill_chunk else []
        return [f for flag in FORETELL_SERVERS[name] for f in (drafter_flags if flag == "DRAFTER" else [flag])] + cache + chunk

    def foretell_starter(name: str):
        return lambda clients, log: Server(name, args, flags(name), log)

    starters = {name: foretell_starter(name) for name in names}
    side = dict.fromkeys(names, FORETELL)
    results["foretell"] = {"servers": {name: " ".join(flags(name)) for name in names}, "drafter": drafter_config}
    if not args.no_llama_cpp:
        draft = None
        if args.draft:
            draft = peer_gguf(args.draft)
            if draft is None:
                raise SystemExit(f"serve_batching: no GGUF file on disk for the draft {args.draft!r}")
        results["llama_cpp"] = {"build": build_info(), "configurations": {}, "draft": str(draft) if draft else None}
        for name, cfg in LLAMA_SERVERS.items():
            if name not in chosen:
                continue
            start = llama_starter(args, cfg, draft)
            if isinstance(start, str):
                print(f"serve_batching: no {name} rows: {start}", file=sys.stderr)
                continue
            starters[name], side[name] = start, LLAMA
            results["llama_cpp"]["configurations"][name] = cfg.describe()
    rows = measure(levels, args.runs, starters, prompts, warm, args.max_tokens, args.seed, args.out)
    for row in rows:
        row["side"] = side[row["server"]]
    results["runs"] = rows
    results["levels"] = median_rows(rows)
    entries = median_by_config(rows, "tokens_per_second", config="server", level="clients")
    results["best"] = {level: {s: {"server": e["config"], "median": e["median"]} for s, e in sides.items()}
                       for level, sides in best_by_level(entries).items()}
    results["ratios"] = ratios(results["levels"], entries)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_report(args.out, results)
    plot(args.out, results)
    (args.out / "serve_load.png").rename(args.out / "serve_batching.png")
    print((args.out / "report.md").read_text())


def median_rows(rows: list[dict]) -> list[dict]:
    """Per (server, clients): the run whose tokens/s is the median (the lower middle for an even count), with
    tokens_per_second set to the median and every run's figure in runs_tokens_per_second."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["server"], r["clients"]), []).append(r)
    out = []
    for group in groups.values():
        ranked = sorted(group, key=lambda r: r["tokens_per_second"])
        middle = ranked[(len(ranked) - 1) // 2]
        out.append({**middle, "tokens_per_second": round(statistics.median(r["tokens_per_second"] for r in group), 2),
                    "runs_tokens_per_second": [r["tokens_per_second"] for r in group]})
    return out


def ratios(levels: list[dict], entries: list[dict]) -> dict:
    """Per concurrency: each foretell server's median total tokens/s over plain batched decoding's, and foretell's
    best over llama.cpp's best (each side's configuration with the highest median)."""
    best = best_ratio(best_by_level(entries), FORETELL, LLAMA)
    out = {}
    for clients in sorted({r["clients"] for r in levels}):
        rate = {r["server"]: r["tokens_per_second"] for r in levels if r["clients"] == clients}
        row = {f"{name} / plain": round(v / rate["plain"], 3) for name, v in rate.items()
               if name in FORETELL_SERVERS and name != "plain" and "plain" in rate}
        if clients in best:
            row["foretell best / llama.cpp best"] = best[clients]["ratio"]
        out[clients] = row
    return out


def write_report(out: Path, results: dict) -> None:
    lines = []
    if "single_vs_batched" in results:
        s = results["single_vs_batched"]
        lines += [f"One request at a time, in process: single-request engine {s['single_tokens_per_second']} tok/s, "
                  f"batching engine {s['batched_tokens_per_second']} tok/s ({s['ratio']:.3f}x).", ""]
    runs = results["settings"].get("runs", "?")
    lines += [f"Every configuration {runs} time(s) at each level, each on a fresh server warmed up on prompts outside "
              "the measured set; tokens/s is the median of the runs, latencies those of the median run.", "",
              "| server | clients | served | failed | tokens/s (median) | runs | TTFT p50 / p90 (s) | "
              "ITL p50 / p90 / p99 (ms) | tau |", "|---|" + "---:|" * 8]
    for r in results["levels"]:
        ttft = f"{r['ttft_p50']:.2f} / {r['ttft_p90']:.2f}" if r["ttft_p50"] is not None else "–"
        itl = (" / ".join(f"{1000 * r[k]:.0f}" for k in ("itl_p50", "itl_p90", "itl_p99"))
               if r["itl_p50"] is not None else "–")
        tau = f"{r['mean_acceptance_length']:.2f}" if r["mean_acceptance_length"] else "–"
        each = ", ".join(f"{v:.1f}" for v in r.get("runs_tokens_per_second", [r["tokens_per_second"]]))
        lines.append(f"| {r['server']} | {r['clients']} | {r['served']} | {r['failed']} | {r['tokens_per_second']:.1f} "
                     f"| {each} | {ttft} | {itl} | {tau} |")
    entries = median_by_config(results["runs"], "tokens_per_second", config="server", level="clients")
    lines += ["", "Each side at its best (tokens/s, median of the runs):", ""]
    lines += markdown(entries, FORETELL, LLAMA, unit="tok/s", level_name="clients")
    columns = list(dict.fromkeys(c for row in results["ratios"].values() for c in row))
    if columns:
        lines += ["", "| clients | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
        for clients, row in results["ratios"].items():
            lines.append(f"| {clients} | " + " | ".join(f"{row[c]:.3f}" if c in row else "–" for c in columns) + " |")
    lines += ["", "Caches that carry answers across requests: " + (
        "on on both sides, as the servers start (foretell's prefix cache and its drafter's result cache, "
        "llama-server's cache_prompt and RAM cache); each server fresh per run and warmed up on other prompts, so a "
        "prompt is reused within a run only." if results.get("caches") else
        "off on both sides (foretell --prefix-cache-mb 0 and its drafter's result cache off; llama-server "
        "--no-cache-prompt --cache-ram 0): every request reads its whole prompt and drafts from itself alone.")]
    if "foretell" in results:
        lines += ["", f"foretell's speculative drafter: {results['foretell']['drafter']}."]
    if "llama_cpp" in results:
        build = results["llama_cpp"]["build"]
        lines += ["", f"llama-server: {build.get('build', 'unknown')} build of llama-cpp-python "
                      f"{build.get('version', '?')}'s llama.cpp ({' '.join(build.get('cmake_flags', []))}); "
                      "configurations:"]
        lines += [f"- {name}: {what}" for name, what in results["llama_cpp"]["configurations"].items()]
    (out / "report.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
