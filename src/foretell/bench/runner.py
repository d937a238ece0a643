"""Run every method on every prompt, interleaved, one JSONL row per (prompt, method), resumable.

Interleaving (prompt 1: every method, prompt 2: every method, ...) spreads slow drift of the
machine (thermal, other load) over all methods alike instead of penalising whichever ran last.
Rows are appended as soon as they exist, so an interrupted run loses at most one row and a
second run with the same output folder only computes the missing pairs.

With runs > 1 the whole interleaved pass is repeated (row field `run`), so a comparison can take each method's
median over runs. Unless caches are on, every method is reset before each timed request (foretell's result cache
forgets earlier requests' outputs; llama-server keeps no prompt cache anyway), so no request, the same prompt in a
later run included, is drafted from an earlier one's answer. The untimed warm-up uses WARMUP_PROMPT, a prompt
outside every dataset, never a measured one.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm
from typing import Callable

from foretell.errors import ForetellError
from foretell.kernels import cpu_class

RESULTS = "results.jsonl"
# Counters the report sums over rows (verification pass rate, wasted share, lossy, result cache; drafting and
# verification seconds per pass), and the prompt's length and prefill time (the share of a run no drafter speeds up).
MONITOR_KEYS = ("draft_passes", "passes_with_accepted", "draft_tokens_verified", "lossy_accepted",
                "cache_steps", "cache_hits", "cache_useful", "draft_seconds", "verify_seconds", "prompt_tokens",
                "prefill_seconds")
SUMMARY = "bench.json"
# The warm-up's prompt: in no dataset, so the warm-up never sees a measured prompt.
WARMUP_PROMPT = "Name the three primary colours of light, then say in one sentence why the sky looks blue."


@dataclass(frozen=True)
class RunConfig:
    out_dir: Path
    max_new_tokens: int = 128
    greedy: bool = True  # greedy_equal_to_plain is only meaningful (and only filled) when greedy
    resume: bool = True
    warmup_tokens: int = 16  # the untimed warm-up generation per method
    settings: dict = field(default_factory=dict)  # what produced the rows; a resumed run must match
    progress: bool = True
    runs: int = 1  # interleaved passes over every (prompt, method); rows carry their run number
    caches: bool = False  # keep caches that carry answers across requests (else reset every method per request)


def row_key(row: dict) -> tuple[str, str, int, str]:
    return row["dataset"], str(row["id"]), row.get("run", 0), row["method"]


def read_rows(path: Path) -> list[dict]:
    """Rows of a results file; a line cut short by an interruption is dropped (and the file rewritten)."""
    if not path.is_file():
        return []
    rows, broken = [], False
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            broken = True
    if broken:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def prepare_out_dir(cfg: RunConfig) -> dict:
    """Create the folder; on resume check the settings match; return the stored summary."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = cfg.out_dir / SUMMARY
    if not cfg.resume:
        (cfg.out_dir / RESULTS).unlink(missing_ok=True)
        summary_path.unlink(missing_ok=True)
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    old = summary.get("settings", cfg.settings)
    changed = {k: (old.get(k), v) for k, v in cfg.settings.items() if old.get(k) != v}
    if changed:
        what = ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in changed.items())
        raise ForetellError(
            f"{cfg.out_dir} holds results made with other settings ({what}); "
            "use another --out, or --no-resume to start over"
        )
    summary["settings"] = cfg.settings
    return summary


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def make_row(prompt: dict, method, tokens: list[int], stats: dict, seconds: float, plain_tokens, run: int = 0) -> dict:
    return {
        "dataset": prompt["dataset"], "id": prompt["id"], "category": prompt["category"], "method": method.name,
        "run": run,
        "new_tokens": len(tokens), "seconds": round(seconds, 4),
        "tokens_per_s": round(len(tokens) / seconds, 3) if seconds else 0.0,
        "tau": round(stats["tau"], 4) if stats.get("tau") is not None else None,
        "acceptance_per_position": [round(a, 4) for a in stats.get("acceptance_per_position", [])],
        "proposed_per_position": stats.get("proposed_per_position", []),
        "accepted_per_position": stats.get("accepted_per_position", []),
        "target_passes": stats.get("target_passes"),
        "mean_verified_drafts": round(stats.get("mean_verified_drafts", 0.0), 3),
        "greedy_equal_to_plain": None if plain_tokens is None else tokens == plain_tokens,
        "memory_mb": round(method.memory_bytes() / 2**20, 2),
        "tokens": tokens,
        # monitoring counters (foretell methods): pass rate, wasted share, lossy and result-cache counts, timings
        **{k: round(stats[k], 5) if isinstance(stats[k], float) else stats[k] for k in MONITOR_KEYS if k in stats},
    }


def order_methods(methods: list) -> list:
    """plain first, so every other method's output can be compared with it as soon as it is done."""
    return sorted(methods, key=lambda m: m.name != "plain")


def run_bench(prompts: list[dict], methods: list, encode: Callable[[str], list[int]], cfg: RunConfig) -> Path:
    """Run (or finish) the benchmark; return the results file."""
    summary = prepare_out_dir(cfg)
    path = cfg.out_dir / RESULTS
    done = {row_key(r): r for r in read_rows(path)}
    methods = order_methods(methods)
    todo = [(run, p, m) for run in range(cfg.runs) for p in prompts for m in methods
            if (p["dataset"], str(p["id"]), run, m.name) not in done]
    if todo:
        warm_up([m for _, _, m in todo], encode, cfg)
    with open(path, "a") as out, tqdm(total=len(todo), desc="bench", unit="run", file=sys.stderr,
                                      disable=not cfg.progress) as bar:
        cache: dict[tuple, list[int]] = {}
        for run, prompt, method in todo:
            key = (prompt["dataset"], str(prompt["id"]))
            if key not in cache:
                cache[key] = encode(prompt["prompt"])
            ids = cache[key]
            bar.set_postfix_str(f"{prompt['dataset']}/{prompt['id']} {method.name}" + (f" run {run}" if run else ""))
            if not cfg.caches:
                method.reset()  # nothing an earlier request left (its outputs in a result cache) may draft this one
            t0 = time.perf_counter()
            tokens, stats = method.run(ids, cfg.max_new_tokens)
            seconds = time.perf_counter() - t0
            plain = {"tokens": tokens} if method.name == "plain" else done.get((*key, run, "plain"))
            plain_tokens = plain["tokens"] if plain is not None and cfg.greedy else None
            row = make_row(prompt, method, tokens, stats, seconds, plain_tokens, run)
            done[row_key(row)] = row
            out.write(json.dumps(row) + "\n")
            out.flush()  # the row survives an interruption
            bar.update()
    summary["peak_rss_mb"] = round(max(summary.get("peak_rss_mb", 0.0), peak_rss_mb()), 1)
    summary["cpu_class"] = cpu_class()  # what benchmarks/ship/default_drafter.py files the ranking under
    peers = {m.name: m.peer for m in methods if getattr(m, "peer", None)}  # llama.cpp's command line and build
    if peers:
        summary["peers"] = peers
    (cfg.out_dir / SUMMARY).write_text(json.dumps(summary, indent=2))
    return path


def warm_up(methods: list, encode, cfg: RunConfig) -> None:
    """One short untimed run per pending method, on WARMUP_PROMPT (no measured prompt): first-call costs
    (allocation, kernels) stay out of the timings."""
    seen = set()
    ids = encode(WARMUP_PROMPT)
    for method in methods:
        if method.name not in seen:
            seen.add(method.name)
            method.run(ids, min(cfg.warmup_tokens, cfg.max_new_tokens))
            method.reset()  # the warm-up's output must not help the timed runs
