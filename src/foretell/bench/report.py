"""Tables and plots from a results file: report.md, speedup.png, acceptance.png.

Speedup is a ratio of total tokens / total seconds, method over plain, both on the prompts
where both have a row (same run, same prompts), so an unfinished run still compares like with like.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from foretell.bench.best import markdown, median_by_config
from foretell.bench.runner import RESULTS, SUMMARY, read_rows
from foretell.errors import ForetellError

OVERALL = "overall"
SHOWN_POSITIONS = 8  # acceptance columns in the table (the plot shows them all)


@dataclass
class MethodSummary:
    method: str
    prompts: int
    tokens_per_s: float
    speedup: float | None  # None without plain rows on the same prompts
    tau: float | None
    acceptance: list[float] = field(default_factory=list)  # by draft position
    memory_mb: float = 0.0
    verified_per_pass: float | None = None  # mean draft tokens verified per target pass (the budget)
    greedy_equal: tuple[int, int] = (0, 0)  # (equal, compared)
    pass_rate: float | None = None  # share of passes with drafts that accepted >= 1 draft token
    wasted: float | None = None  # draft tokens verified but not accepted / draft tokens verified
    draft_ms: float | None = None  # drafting time per target pass (foretell methods; None for peers)
    verify_ms: float | None = None  # the target's verification time per pass


def prompt_key(row: dict) -> tuple[str, str]:
    return row["dataset"], str(row["id"])


def throughput(rows: list[dict]) -> float:
    seconds = sum(r["seconds"] for r in rows)
    return sum(r["new_tokens"] for r in rows) / seconds if seconds else 0.0


def mean_tau(rows: list[dict]) -> float | None:
    """Tokens per target pass over all rows: each row's tau weighted by its passes."""
    rows = [r for r in rows if r.get("tau") is not None]
    passes = sum(r.get("target_passes") or 0 for r in rows)
    if passes:
        return sum(r["tau"] * (r.get("target_passes") or 0) for r in rows) / passes
    return sum(r["tau"] for r in rows) / len(rows) if rows else None


def mean_verified(rows: list[dict]) -> float | None:
    """Draft tokens verified per target pass, weighted by passes (None for methods without drafts)."""
    rows = [r for r in rows if r.get("mean_verified_drafts")]
    passes = sum(r.get("target_passes") or 0 for r in rows)
    return sum(r["mean_verified_drafts"] * r["target_passes"] for r in rows) / passes if passes else None


def acceptance(rows: list[dict]) -> list[float]:
    """Accepted / proposed per draft position, summed over rows (counts when the rows carry them)."""
    width = max((len(r.get("proposed_per_position") or r.get("acceptance_per_position") or []) for r in rows), default=0)
    proposed, accepted = [0.0] * width, [0.0] * width
    for r in rows:
        counts = r.get("proposed_per_position")
        p = counts if counts else [1.0] * len(r.get("acceptance_per_position", []))
        a = r.get("accepted_per_position") if counts else r.get("acceptance_per_position", [])
        for i, (pi, ai) in enumerate(zip(p, a)):
            proposed[i] += pi
            accepted[i] += ai
    return [a / p if p else 0.0 for a, p in zip(accepted, proposed)]


def monitoring(rows: list[dict]) -> tuple[float | None, float | None]:
    """JetSpec's monitoring metrics over rows: verification pass rate and wasted share (None without counts)."""
    rows = [r for r in rows if r.get("draft_passes")]
    passes = sum(r["draft_passes"] for r in rows)
    verified = sum(r.get("draft_tokens_verified") or 0 for r in rows)
    accepted = sum(sum(r.get("accepted_per_position") or []) for r in rows)
    pass_rate = sum(r.get("passes_with_accepted") or 0 for r in rows) / passes if passes else None
    return pass_rate, (1.0 - accepted / verified if verified else None)


def ms_per_pass(rows: list[dict], key: str) -> float | None:
    """A time the rows report (draft_seconds, verify_seconds) per target pass, in ms (None where none reports it)."""
    rows = [r for r in rows if r.get(key) is not None and r.get("target_passes")]
    passes = sum(r["target_passes"] for r in rows)
    return 1000 * sum(r[key] for r in rows) / passes if passes else None


def summarize_group(rows: list[dict]) -> list[MethodSummary]:
    by_method: dict[str, list[dict]] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)
    plain = {prompt_key(r): r for r in by_method.get("plain", [])}
    out = []
    for method, mrows in by_method.items():
        common = [r for r in mrows if prompt_key(r) in plain]
        base = throughput([plain[prompt_key(r)] for r in common])
        compared = [r["greedy_equal_to_plain"] for r in mrows if r.get("greedy_equal_to_plain") is not None]
        out.append(MethodSummary(
            method=method, prompts=len(mrows), tokens_per_s=throughput(mrows),
            speedup=throughput(common) / base if common and base else None,
            tau=mean_tau(mrows), acceptance=acceptance(mrows),
            memory_mb=max(r.get("memory_mb") or 0.0 for r in mrows),
            verified_per_pass=mean_verified(mrows),
            greedy_equal=(sum(compared), len(compared)),
        ))
        out[-1].pass_rate, out[-1].wasted = monitoring(mrows)
        out[-1].draft_ms, out[-1].verify_ms = ms_per_pass(mrows, "draft_seconds"), ms_per_pass(mrows, "verify_seconds")
    return out


def summarize(rows: list[dict]) -> dict[str, list[MethodSummary]]:
    """Per category (in order of first appearance), then OVERALL."""
    categories: dict[str, list[dict]] = {}
    for r in rows:
        categories.setdefault(r["category"], []).append(r)
    groups = {c: summarize_group(rs) for c, rs in categories.items()}
    groups[OVERALL] = summarize_group(rows)
    return groups


def _fmt(x: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if x is None else f"{x:.{digits}f}{suffix}"


def markdown_table(summaries: list[MethodSummary]) -> str:
    lines = [
        "| method | prompts | tok/s | speedup | tau | drafts verified / pass | acceptance by position | pass rate | wasted "
        "| draft / verify ms a pass | memory MB | greedy = plain |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        acc = " ".join(f"{a:.2f}" for a in s.acceptance[:SHOWN_POSITIONS]) or "–"
        equal = f"{s.greedy_equal[0]}/{s.greedy_equal[1]}" if s.greedy_equal[1] else "–"
        timing = "–" if s.draft_ms is None else f"{s.draft_ms:.1f} / {_fmt(s.verify_ms, 1)}"
        lines.append(f"| {s.method} | {s.prompts} | {s.tokens_per_s:.1f} | {_fmt(s.speedup, 2, 'x')} | "
                     f"{_fmt(s.tau)} | {_fmt(s.verified_per_pass, 1)} | {acc} | {_fmt(s.pass_rate)} | {_fmt(s.wasted)} | "
                     f"{timing} | {s.memory_mb:.1f} | {equal} |")
    return "\n".join(lines)


def plot_speedup(groups: dict[str, list[MethodSummary]], path: Path) -> None:
    # start-up: matplotlib takes most of a second to import, and only plots use it
    import matplotlib

    matplotlib.use("Agg")  # files only; no display
    import matplotlib.pyplot as plt

    cats = list(groups)
    methods = [m for m in dict.fromkeys(s.method for ss in groups.values() for s in ss) if m != "plain"]
    # Wide enough for every bar, but capped: many categories x methods made an unreadable strip.
    fig, ax = plt.subplots(figsize=(min(18, max(6, 0.3 * len(cats) * max(1, len(methods)) + 2)), 5))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        values = [next((s.speedup or 0.0 for s in groups[c] if s.method == m), 0.0) for c in cats]
        ax.bar([x + i * width for x in range(len(cats))], values, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")  # plain
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(cats))], cats, rotation=30, ha="right")
    ax.set_ylabel("speedup over plain (tokens/s ratio)")
    ax.set_title("speedup by category (dashed: plain)")
    if methods:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_acceptance(overall: list[MethodSummary], path: Path) -> None:
    # start-up: matplotlib takes most of a second to import, and only plots use it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = [s for s in overall if s.acceptance]
    for s in drawn:
        ax.plot(range(1, len(s.acceptance) + 1), s.acceptance, marker="o", label=s.method)
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no drafting method in this run", ha="center", va="center", transform=ax.transAxes)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title("acceptance by draft position (all prompts)")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (accepted / proposed)")
    ax.set_ylim(0, 1.05)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def budget_of(method: str) -> tuple[str, int] | None:
    """'hidden-state@16' -> ('hidden-state', 16); None for a method without a budget."""
    base, _, digits = method.partition("@")
    return (base, int(digits)) if digits.isdigit() else None


def sweep_points(overall: list[MethodSummary], default_budget: int | None) -> list[tuple[int, MethodSummary]]:
    """(budget, summary) for every fixed-budget dynamic tree in the run, smallest budget first."""
    points = []
    for s in overall:
        parsed = budget_of(s.method)
        if parsed is not None and parsed[0] == "draft-tree":
            points.append((parsed[1], s))
        elif s.method == "draft-tree" and default_budget:
            points.append((int(default_budget), s))
    return sorted(points, key=lambda p: p[0])


def budget_section(overall: list[MethodSummary], default_budget: int | None) -> list[str]:
    """The fixed-budget sweep next to what the hardware-aware tuner chose, and tree vs chain."""
    points = sweep_points(overall, default_budget)
    by_name = {s.method: s for s in overall}
    lines: list[str] = []
    if len(points) >= 2:
        best_budget, best = max(points, key=lambda p: p[1].tokens_per_s)
        lines += ["## Tree budget sweep (all prompts)", "",
                  "| tree | tokens verified / pass | tok/s | speedup | tau |", "|---|---:|---:|---:|---:|"]
        rows = [(f"fixed budget {b}", s) for b, s in points]
        if "draft-tree-auto" in by_name:
            rows.append(("hardware-aware (draft-tree-auto)", by_name["draft-tree-auto"]))
        for label, s in rows:
            lines.append(f"| {label} | {_fmt(s.verified_per_pass, 1)} | {s.tokens_per_s:.2f} | "
                         f"{_fmt(s.speedup, 2, 'x')} | {_fmt(s.tau)} |")
        lines.append("")
        lines.append(f"Best fixed budget: {best_budget} ({best.tokens_per_s:.2f} tok/s).")
        auto = by_name.get("draft-tree-auto")
        if auto is not None:
            gap = auto.tokens_per_s / best.tokens_per_s - 1.0
            lines.append(f" The tuner verified {_fmt(auto.verified_per_pass, 1)} tokens per pass on average and ran at "
                         f"{auto.tokens_per_s:.2f} tok/s: {gap:+.1%} against the best fixed budget.")
        lines.append("")
    chain = by_name.get("draft-chain")
    for name, label in (("draft-tree", "Dynamic tree"), ("draft-tree-auto", "Hardware-aware dynamic tree")):
        tree = by_name.get(name)
        if chain is not None and tree is not None and chain.tau and tree.tau:
            lines += [f"{label} vs chain: tau {tree.tau:.2f} vs {chain.tau:.2f}, "
                      f"tok/s {tree.tokens_per_s:.2f} vs {chain.tokens_per_s:.2f} "
                      f"({tree.tokens_per_s / chain.tokens_per_s:.2f}x).", ""]
    return lines


def side_of(method: str) -> str:
    """Which tool a method's row measures: llama.cpp's llama-server, its Python binding, transformers, or foretell."""
    if method.startswith("llama-cpp-python"):
        return "llama-cpp-python"
    if method.startswith("llama-cpp"):
        return "llama.cpp"
    return "transformers" if method.startswith("hf-") else "foretell"


def best_section(rows: list[dict], summary: dict) -> list[str]:
    """With llama-server methods in the run: every method's tokens/s in each run (its total over the run's rows),
    the median over runs, each side's best configuration and foretell best / llama.cpp best."""
    if not any(side_of(r["method"]) == "llama.cpp" for r in rows):
        return []
    per_run: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if side_of(r["method"]) in ("foretell", "llama.cpp"):
            per_run.setdefault((r["method"], r.get("run", 0)), []).append(r)
    runs = [{"config": method, "level": "1 request", "side": side_of(method), "run": run, "tok/s": throughput(rs)}
            for (method, run), rs in sorted(per_run.items(), key=lambda kv: kv[0][1])]
    entries = median_by_config(runs, "tok/s")
    caches = (summary.get("settings") or {}).get("caches", True)
    lines = ["## Each side at its best (all prompts)", "",
             "Tokens/s of each method over all prompts in each run, the median over runs, and each side's best by that "
             "median. Caches that carry answers across requests: " + (
                 "off on both sides (every method reset before each request; llama-server without its prompt cache)."
                 if caches is False else "on (foretell's result caches keep earlier requests' outputs; llama-server "
                 "keeps its prompt cache)."), ""]
    lines += markdown(entries, "foretell", "llama.cpp", unit="tok/s", level_name="level")
    peers = summary.get("peers") or {}
    if peers:
        lines += ["", "llama.cpp configurations:"]
        for name, peer in peers.items():
            build = peer.get("build") or {}
            lines.append(f"- {name}: {peer.get('configuration', '')} (`llama-server {' '.join(peer.get('command', []))}`; "
                         f"{build.get('build', 'unknown')} build {' '.join(build.get('cmake_flags', []))})")
    return lines + [""]


def write_report(out_dir: Path) -> Path:
    """Write report.md, speedup.png and acceptance.png into out_dir; return report.md."""
    out_dir = Path(out_dir)
    rows = read_rows(out_dir / RESULTS)
    if not rows:
        raise ForetellError(f"no results in {out_dir / RESULTS}; run foretell bench first")
    summary = json.loads((out_dir / SUMMARY).read_text()) if (out_dir / SUMMARY).is_file() else {}
    groups = summarize(rows)
    parts = ["# foretell bench", ""]
    if summary.get("settings"):
        parts += ["Settings: " + ", ".join(f"{k}={v}" for k, v in summary["settings"].items()), ""]
    if "peak_rss_mb" in summary:
        parts += [f"Peak RSS of the process (all methods' models loaded together): {summary['peak_rss_mb']:.0f} MB. "
                  "The memory column is one method's weights plus its KV caches.", ""]
    for name, summaries in groups.items():
        parts += [f"## {name}", "", markdown_table(summaries), ""]
    parts += budget_section(groups[OVERALL], (summary.get("settings") or {}).get("tree_budget"))
    parts += best_section(rows, summary)
    parts += ["Pass rate: share of target passes with drafts that accepted at least one draft token; wasted: "
              "draft tokens the target verified but did not accept, over all it verified (JetSpec's monitoring). "
              "Draft / verify ms a pass: the drafter's time and the target's verification time per target pass "
              "(plain decoding: its one-token steps).", ""]
    parts += ["![speedup](speedup.png)", "", "![acceptance](acceptance.png)", ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(parts))
    plot_speedup(groups, out_dir / "speedup.png")
    plot_acceptance(groups[OVERALL], out_dir / "acceptance.png")
    return report
