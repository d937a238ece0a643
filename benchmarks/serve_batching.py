"""Serving throughput with batching: plain batched vs speculative batched (foretell's batch-aware budget) vs the
fixed-by-batch-size rule, and llama.cpp's OpenAI-compatible server on the same model, in one run.

    .venv/bin/python benchmarks/serve_batching.py --out runs/serve_batching [--drafter "--drafter prompt-lookup"]

At each concurrency level (1, 4, 16 closed-loop streaming chat clients, greedy, Spec-Bench prompts) every server
serves the same requests, the servers taking turns level by level so all see the same machine. Reports total
tokens/s and per-request latency (time to first token, inter-token latency, end to end) and the ratios the
batching issue asks for. Before the servers, an in-process check: the batching engine with one request against
the single-request engine, same drafter, same prompts, interleaved. Writes OUT/results.json, OUT/report.md,
OUT/serve_batching.png. llama.cpp needs llama-cpp-python with its server (scripts/install_llama_cpp.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import Server, free_port, plot, run_level, start_and_wait, summarize  # noqa: E402  (a sibling script)

from foretell.bench.datasets import load_prompts  # noqa: E402


class LlamaCppServer:
    """llama-cpp-python's OpenAI-compatible server on the preset's own GGUF file, on a free port."""

    def __init__(self, gguf: Path, threads: int, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "m", "--host",
               "127.0.0.1", "--port", str(self.port), "--n_threads", str(threads), "--n_ctx", "4096",
               "--interrupt_requests", "False"]  # queue concurrent requests instead of cutting the running one off
        self.command = " ".join(cmd[1:])
        self.proc = start_and_wait(cmd, log, f"{self.url}/v1/models", "llama.cpp's server", 300)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=60)


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
    p.add_argument("--drafter", default="--drafter prompt-lookup",
                   help="the speculative servers' drafter flags (default: %(default)s)")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", default="12,24,48", help="requests per level and server (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--per-category", type=int, default=4)
    p.add_argument("--single-prompts", type=int, default=8, help="prompts of the in-process check (0 = skip)")
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/serve_batching") / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = [row["prompt"] for row in load_prompts(["spec-bench"], args.per_category)]
    random.Random(args.seed).shuffle(prompts)
    drafter = args.drafter.split()
    results: dict = {"settings": {k: str(v) for k, v in vars(args).items()}, "levels": []}
    if args.single_prompts:
        results["single_vs_batched"] = single_vs_batch(args.model, drafter, prompts[: args.single_prompts],
                                                       args.max_tokens, args.threads)
        print(json.dumps(results["single_vs_batched"]), file=sys.stderr)

    args.leave_share = 0.0
    servers: dict[str, object] = {
        "plain": Server("plain", args, ["--drafter", "none"], args.out / "server-plain.log"),
        "speculative": Server("speculative", args, [*drafter, "--batch-budget", "auto"], args.out / "server-spec.log"),
        "fixed-by-batch-size": Server("fixed-by-batch-size", args, [*drafter, "--batch-budget", "fixed"],
                                      args.out / "server-fixed.log"),
    }
    if not args.no_llama_cpp and importlib.util.find_spec("llama_cpp") is not None:
        from foretell.models.presets import gguf_file

        gguf = gguf_file(args.model)
        if gguf is not None:
            servers["llama.cpp"] = LlamaCppServer(gguf, args.threads, args.out / "server-llama-cpp.log")
    for name, server in servers.items():  # warm-up: every prompt once
        asyncio.run(run_level(server.url, "m", prompts, len(prompts), 1, 8, 0.0, random.Random(0)))
    for clients, count in zip([int(c) for c in args.clients.split(",")], [int(n) for n in args.requests.split(",")]):
        for name, server in servers.items():
            outcomes, wall = asyncio.run(run_level(server.url, "m", prompts, count, clients, args.max_tokens, 0.0,
                                                   random.Random(args.seed + clients)))
            row = summarize(name, clients, outcomes, wall)
            results["levels"].append(row)
            print(json.dumps(row), file=sys.stderr)
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
    llama.cpp's."""
    out = {}
    for clients in sorted({r["clients"] for r in levels}):
        rate = {r["server"]: r["tokens_per_second"] for r in levels if r["clients"] == clients}
        row = {f"{name} / plain": round(v / rate["plain"], 3) for name, v in rate.items() if name != "plain"}
        if "llama.cpp" in rate:
            best = max(v for name, v in rate.items() if name != "llama.cpp")
            row["foretell best / llama.cpp"] = round(best / rate["llama.cpp"], 3)
        out[clients] = row
    return out


def write_report(out: Path, results: dict) -> None:
    lines = []
    if "single_vs_batched" in results:
        s = results["single_vs_batched"]
        lines += [f"One request at a time, in process: single-request engine {s['single_tokens_per_second']} tok/s, "
                  f"batching engine {s['batched_tokens_per_second']} tok/s ({s['ratio']:.3f}x).", ""]
    lines += ["| server | clients | served | failed | tokens/s | TTFT p50 / p90 (s) | ITL p50 / p90 (ms) | tau |",
              "|---|" + "---:|" * 7]
    for r in results["levels"]:
        ttft = f"{r['ttft_p50']:.2f} / {r['ttft_p90']:.2f}" if r["ttft_p50"] is not None else "–"
        itl = f"{1000 * r['itl_p50']:.0f} / {1000 * r['itl_p90']:.0f}" if r["itl_p50"] is not None else "–"
        tau = f"{r['mean_acceptance_length']:.2f}" if r["mean_acceptance_length"] else "–"
        lines.append(f"| {r['server']} | {r['clients']} | {r['served']} | {r['failed']} | {r['tokens_per_second']:.1f} "
                     f"| {ttft} | {itl} | {tau} |")
    lines += ["", "| clients | " + " | ".join(next(iter(results["ratios"].values()))) + " |",
              "|---|" + "---:|" * len(next(iter(results["ratios"].values())))]
    for clients, row in results["ratios"].items():
        lines.append(f"| {clients} | " + " | ".join(f"{v:.3f}" for v in row.values()) + " |")
    (out / "report.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
