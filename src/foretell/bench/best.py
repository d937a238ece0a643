"""Each side at its best: medians over repeated runs, and the best configuration of each side per level.

A comparison runs every configuration of both sides (foretell's and its peer's) several times at each level
(a concurrency, or one level for single-request benchmarks). A configuration's figure at a level is the median
of its runs; each side's best at a level is its configuration with the highest median, and the headline ratio is
foretell's best over the peer's best at that level. Used by `foretell bench` (report.py) and the comparison
scripts under benchmarks/ (serve_batching.py, decode_vs_llama_bench.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

MIN_RUNS = 3  # fewer runs than this and a "best" is one lucky sample: the reports say so


def median_by_config(rows: Iterable[dict], value: str, config: str = "config", level: str = "level",
                     side: str = "side") -> list[dict]:
    """One entry per (config, level) in order of first appearance: {config, level, side, runs (the values in run
    order), median}."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = (r[config], r[level])
        entry = groups.setdefault(key, {"config": r[config], "level": r[level], "side": r.get(side), "runs": []})
        entry["runs"].append(r[value])
    for entry in groups.values():
        entry["median"] = statistics.median(entry["runs"])
    return list(groups.values())


def best_by_level(entries: list[dict]) -> dict:
    """level -> side -> the entry (median_by_config's) with that side's highest median at that level."""
    best: dict = {}
    for e in entries:
        at = best.setdefault(e["level"], {})
        if e["side"] not in at or e["median"] > at[e["side"]]["median"]:
            at[e["side"]] = e
    return best


def best_ratio(best: dict, ours: str, peer: str) -> dict:
    """level -> {ours, peer (the configurations), ratio (ours' best median / peer's)} where both sides ran."""
    out = {}
    for level, sides in best.items():
        if ours in sides and peer in sides and sides[peer]["median"]:
            out[level] = {ours: sides[ours]["config"], peer: sides[peer]["config"],
                          "ratio": round(sides[ours]["median"] / sides[peer]["median"], 3)}
    return out


def runs_note(entries: list[dict]) -> str:
    """A sentence when some configuration has fewer than MIN_RUNS runs (its median is then a thin basis)."""
    fewest = min((len(e["runs"]) for e in entries), default=MIN_RUNS)
    if fewest >= MIN_RUNS:
        return ""
    return (f"Some configurations ran only {fewest} time(s): a best picked from fewer than {MIN_RUNS} runs may be one "
            "lucky sample.")


def markdown(entries: list[dict], ours: str, peer: str, unit: str = "tok/s", level_name: str = "level") -> list[str]:
    """Report lines: every configuration's median and runs per level, then each side's best and the ratio."""
    lines = [f"| {level_name} | side | configuration | median {unit} | runs |", "|---|---|---|---:|---|"]
    best = best_by_level(entries)
    for e in sorted(entries, key=lambda e: (e["level"], e["side"] != ours)):
        mark = " (best)" if best[e["level"]].get(e["side"]) is e else ""
        runs = ", ".join(f"{v:.2f}" for v in e["runs"])
        lines.append(f"| {e['level']} | {e['side']} | {e['config']}{mark} | {e['median']:.2f} | {runs} |")
    lines += ["", f"| {level_name} | {ours} best | {peer} best | {ours} best / {peer} best |", "|---|---|---|---:|"]
    for level, r in best_ratio(best, ours, peer).items():
        lines.append(f"| {level} | {r[ours]} ({best[level][ours]['median']:.2f}) | {r[peer]} "
                     f"({best[level][peer]['median']:.2f}) | {r['ratio']:.3f} |")
    note = runs_note(entries)
    return lines + (["", note] if note else [])
