"""Load and fault run for `foretell serve` (a script, not a timed test).

Starts a plain and a speculative server itself, then, on each in turn and at each concurrency level, runs
closed-loop streaming chat clients over Spec-Bench prompts for a fixed number of requests; a share of the
requests disconnect mid-stream on purpose. Reports requests served / disconnected / failed, total tokens/s,
time to first token and inter-token latency percentiles, each server's own accounting (/metrics), its memory
before and after (after a warm-up; growth must stay within --rss-bound-mib), and that SIGTERM stops it with
status 0. Writes OUT/results.json, OUT/report.md and OUT/serve_load.png.

    .venv/bin/python benchmarks/serve/serve_load.py --out runs/serve_load/cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from foretell.bench.datasets import load_prompts


@dataclass
class Outcome:
    status: str  # ok | disconnected (on purpose) | failed
    error: str = ""
    ttft: float | None = None  # seconds from sending to the first text
    gaps: list[float] = field(default_factory=list)  # seconds between successive text events
    tokens: int = 0
    acceptance_length: float | None = None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                      leave_after: int | None) -> Outcome:
    """One streaming chat request; leave_after: close the connection after that many text events."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start, last, out, events = time.perf_counter(), None, Outcome("failed"), 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    if not out.tokens:  # a server without stream usage (llama.cpp's): one token per text event
                        out.tokens = events
                    out.status = "ok" if out.tokens else "failed"
                    out.error = "" if out.tokens else "no usage before [DONE]"
                    return out
                event = json.loads(line[6:])
                if "error" in event:
                    out.error = f"error event: {event['error']}"
                    return out
                now = time.perf_counter()
                if any(c["delta"].get("content") for c in event["choices"]):
                    out.ttft = out.ttft if out.ttft is not None else now - start
                    if last is not None:
                        out.gaps.append(now - last)
                    last, events = now, events + 1
                    if leave_after is not None and events >= leave_after:
                        out.status = "disconnected"
                        return out  # leaving the block closes the connection mid-stream
                if event.get("usage"):
                    out.tokens = event["usage"]["completion_tokens"]
                if event.get("speculative_decoding"):
                    out.acceptance_length = event["speculative_decoding"]["mean_acceptance_length"]
        out.error = "the stream ended without [DONE]"
    except httpx.HTTPError as e:
        out.error = f"{type(e).__name__}: {e}"
    return out


async def run_level(url: str, model: str, prompts: list[str], requests: int, clients: int, max_tokens: int,
                    leave_share: float, rng: random.Random) -> tuple[list[Outcome], float]:
    """`clients` closed-loop clients share `requests` requests; returns the outcomes and the wall time."""
    plan = [(prompts[i % len(prompts)], rng.randint(1, 8) if rng.random() < leave_share else None)
            for i in range(requests)]
    todo, outcomes = list(reversed(plan)), []

    async def client_loop(client):
        while todo:
            prompt, leave_after = todo.pop()
            outcomes.append(await one_request(client, url, model, prompt, max_tokens, leave_after))

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return outcomes, time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_and_wait(cmd: list[str], log: Path, ready_url: str, what: str, limit_s: float) -> subprocess.Popen:
    """Start `cmd` with its output in `log` and wait until `ready_url` answers 200; exit naming `what` if the
    process dies first or `limit_s` passes."""
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + limit_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited while starting; see {log}")
        try:
            if httpx.get(ready_url).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start within {limit_s:.0f} s; see {log}")
        time.sleep(0.5)


class Server:
    """A `foretell serve` subprocess on a free 127.0.0.1 port."""

    def __init__(self, name: str, args: argparse.Namespace, flags: list[str], log: Path):
        self.port = free_port()
        self.name, self.url = name, f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "foretell.cli", "serve", "--model", args.model, "--dtype", args.dtype,
               "--port", str(self.port), "--served-model-name", "m", "--log-level", "warning",
               "--threads", str(args.threads), *flags]
        self.command = " ".join(cmd[1:])
        self.proc = start_and_wait(cmd, log, f"{self.url}/health", f"server {name}", 600)

    def rss_mib(self) -> float:
        try:
            import psutil

            return psutil.Process(self.proc.pid).memory_info().rss / 2**20
        except ImportError:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
            return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def metrics(self) -> dict[str, float]:
        """Sums of each foretell: sample over its labels, and the labelled ones by label."""
        out: dict[str, float] = {}
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            m = re.match(r"^(foretell:[^\s{]+)(\{[^}]*\})?\s+(\S+)$", line)
            if m and not m.group(1).endswith("_created"):
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
                if m.group(2):
                    out[m.group(1) + m.group(2)] = float(m.group(3))
        return out

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)


def summarize(server: str, clients: int, outcomes: list[Outcome], wall: float) -> dict:
    ok = [o for o in outcomes if o.status == "ok"]
    tokens = sum(o.tokens for o in ok)
    ttft = [o.ttft for o in ok if o.ttft is not None]
    gaps = [g for o in ok for g in o.gaps]
    tau = [o.acceptance_length for o in ok if o.acceptance_length is not None]
    return {"server": server, "clients": clients, "requests": len(outcomes), "served": len(ok),
            "disconnected": sum(o.status == "disconnected" for o in outcomes),
            "failed": sum(o.status == "failed" for o in outcomes),
            "errors": sorted({o.error for o in outcomes if o.status == "failed"})[:5],
            "wall_seconds": round(wall, 1), "tokens": tokens, "tokens_per_second": round(tokens / wall, 2),
            **{f"ttft_p{q}": percentile(ttft, q) for q in (50, 90, 99)},
            **{f"itl_p{q}": percentile(gaps, q) for q in (50, 90, 99)},
            "mean_acceptance_length": round(sum(tau) / len(tau), 3) if tau else None}


def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if x is None else f"{x * scale:.{digits}f}"


def write_report(out: Path, results: dict) -> None:
    lines = ["| server | clients | requests | served | disconnected (on purpose) | failed | tokens/s | "
             "TTFT p50 / p90 / p99 (s) | ITL p50 / p90 / p99 (ms) | tau | RSS after (MiB) |", "|---|" + "---:|" * 10]
    for r in results["levels"]:
        lines.append(f"| {r['server']} | {r['clients']} | {r['requests']} | {r['served']} | {r['disconnected']} | "
                     f"{r['failed']} | {r['tokens_per_second']:.1f} | {fmt(r['ttft_p50'])} / {fmt(r['ttft_p90'])} / "
                     f"{fmt(r['ttft_p99'])} | {fmt(r['itl_p50'], 1000, 0)} / {fmt(r['itl_p90'], 1000, 0)} / "
                     f"{fmt(r['itl_p99'], 1000, 0)} | {fmt(r['mean_acceptance_length'])} | {r['rss_mib']:.0f} |")
    lines += ["", "| server | requests sent | finished (server) | cancelled (server) | error responses | "
              "RSS before / after (MiB) | growth (bound) | SIGTERM exit |", "|---|" + "---:|" * 7]
    for s in results["servers"]:
        lines.append(f"| {s['name']} | {s['sent']} | {s['finished']:.0f} | {s['cancelled']:.0f} | {s['errors']:.0f} | "
                     f"{s['rss_before_mib']:.0f} / {s['rss_after_mib']:.0f} | {s['rss_growth_mib']:+.0f} "
                     f"({results['rss_bound_mib']}) | {s['exit_status']} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")


def plot(out: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    names = list(dict.fromkeys(r["server"] for r in results["levels"]))
    for color, name in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], names):
        rows = [r for r in results["levels"] if r["server"] == name]
        x = [r["clients"] for r in rows]
        axes[0].plot(x, [r["tokens_per_second"] for r in rows], "o-", color=color, label=name)
        for ax, key, scale in ((axes[1], "ttft", 1), (axes[2], "itl", 1000)):
            ax.plot(x, [scale * r[f"{key}_p50"] for r in rows], "o-", color=color, label=f"{name} p50")
            ax.plot(x, [scale * r[f"{key}_p90"] for r in rows], "o--", color=color, alpha=0.6, label=f"{name} p90")
    levels = sorted({r["clients"] for r in results["levels"]})
    for ax, title in zip(axes, ("total tokens/s", "time to first token (s)", "inter-token latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "serve_load.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=1, help="torch threads per server (default: %(default)s)")
    p.add_argument("--servers", nargs="+", default=["plain=--drafter none", "shipped-head="],
                   help="NAME=FLAGS for each server; no flags = the target's default drafter, for SmolLM2 the "
                   "shipped parallel head (default: %(default)s)")
    p.add_argument("--clients", default="1,4,16", help="concurrency levels (default: %(default)s)")
    p.add_argument("--requests", default="30,70,160", help="requests per level, per server (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--leave-share", type=float, default=0.1, help="share of requests that disconnect mid-stream")
    p.add_argument("--per-category", type=int, default=5, help="Spec-Bench prompts per category, each served once "
                   "at each concurrency level as a warm-up before the memory baseline (default: %(default)s)")
    p.add_argument("--rss-bound-mib", type=float, default=32.0,
                   help="largest RSS growth after the warm-up that passes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/serve_load") / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    counts = [int(n) for n in args.requests.split(",")]
    assert len(levels) == len(counts), "--clients and --requests need as many entries"
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = [row["prompt"] for row in load_prompts(["spec-bench"], args.per_category)]
    random.Random(args.seed).shuffle(prompts)

    servers = {}
    for entry in args.servers:
        name, _, flags = entry.partition("=")
        servers[name] = Server(name, args, flags.split(), args.out / f"server-{name}.log")
        print(f"[{name}] up: {servers[name].command}", file=sys.stderr)
    results = {"settings": {k: str(v) for k, v in vars(args).items()}, "rss_bound_mib": args.rss_bound_mib,
               "levels": [], "servers": []}
    sent = dict.fromkeys(servers, 0)
    rss_before = {}
    started = time.perf_counter()
    # The runtime keeps compute kernels and buffers per tensor shape, so memory grows with each new prompt
    # length until shapes repeat, and the batch's KV caches and packed passes peak at the highest concurrency
    # (the allocator keeps freed memory for reuse). The warm-up serves every prompt once at each level (greedy:
    # the run repeats its shapes), so growth after the baseline would be memory kept per request.
    for name, server in servers.items():
        for clients in levels:
            asyncio.run(run_level(server.url, "m", prompts, len(prompts), clients, args.max_tokens, 0.0,
                                  random.Random(0)))
            sent[name] += len(prompts)
        rss_before[name] = server.rss_mib()
    for clients, count in zip(levels, counts):
        for name, server in servers.items():  # the servers alternate, so both see the same machine conditions
            outcomes, wall = asyncio.run(run_level(server.url, "m", prompts, count, clients, args.max_tokens,
                                                   args.leave_share, random.Random(args.seed + clients)))
            sent[name] += count
            row = {**summarize(name, clients, outcomes, wall), "rss_mib": round(server.rss_mib(), 1)}
            results["levels"].append(row)
            print(json.dumps(row), file=sys.stderr)
    for name, server in servers.items():
        time.sleep(1.0)  # let cancelled generations be counted
        m, rss_after = server.metrics(), server.rss_mib()
        results["servers"].append({
            "name": name, "command": server.command, "sent": sent[name],
            "finished": m.get("foretell:request_success_total", 0.0),
            "cancelled": m.get('foretell:request_aborted_total{reason="cancelled"}', 0.0),
            "aborted_other": m.get("foretell:request_aborted_total", 0.0)
            - m.get('foretell:request_aborted_total{reason="cancelled"}', 0.0),
            "errors": m.get("foretell:request_errors_total", 0.0),
            "rss_before_mib": round(rss_before[name], 1), "rss_after_mib": round(rss_after, 1),
            "rss_growth_mib": round(rss_after - rss_before[name], 1), "exit_status": server.stop()})
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    failed = sum(r["failed"] for r in results["levels"])
    lost = [s["name"] for s in results["servers"] if s["finished"] + s["cancelled"] != s["sent"]]
    grew = [s["name"] for s in results["servers"] if s["rss_growth_mib"] > args.rss_bound_mib]
    unclean = [s["name"] for s in results["servers"] if s["exit_status"] != 0 or s["aborted_other"] or s["errors"]]
    results["verdict"] = {"failed_requests": failed, "lost": lost, "memory_over_bound": grew, "unclean": unclean,
                          "pass": not (failed or lost or grew or unclean)}
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_report(args.out, results)
    plot(args.out, results)
    print((args.out / "report.md").read_text())
    print(f"verdict: {results['verdict']}; {results['wall_seconds']:.0f} s; {args.out}", file=sys.stderr)
    sys.exit(0 if results["verdict"]["pass"] else 1)


if __name__ == "__main__":
    main()
