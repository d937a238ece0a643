"""benchmarks/bench/acceptance_check.py judges issue 20's criteria from bench rows: synthetic runs with known ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_run(folder: Path, temperature: float, seconds: dict[str, dict[str, float]], tau: float) -> None:
    """A bench folder: per method, per category, one 100-token prompt taking the given seconds."""
    folder.mkdir()
    rows = []
    for method, by_category in seconds.items():
        for i, (category, s) in enumerate(by_category.items()):
            dataset = "gsm8k" if category == "gsm8k" else "spec-bench"
            rows.append({"dataset": dataset, "id": i, "category": category, "method": method, "new_tokens": 100,
                         "seconds": s, "tau": 1.0 if method == "plain" else tau, "target_passes": 50,
                         "greedy_equal_to_plain": True if temperature == 0 else None})
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "bench.json").write_text(json.dumps({"settings": {"temperature": temperature}}))


def check(greedy: Path, sampled: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/bench/acceptance_check.py", str(greedy), str(sampled)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_acceptance_check_marks_what_holds(tmp_path):
    plain = {"gsm8k": 10.0, "qa": 10.0, "rag": 10.0}
    write_run(tmp_path / "greedy", 0.0, {
        "plain": plain,
        "smollm2-135m-fast": {"gsm8k": 3.0, "qa": 5.0, "rag": 6.0},  # 3.33x, 2x, 1.67x: all hold with tau 3.2
        "smollm2-135m-slow": {"gsm8k": 5.0, "qa": 5.0, "rag": 8.0},  # GSM8K 2x < 2.5x, rag 1.25x < 1.5x
    }, tau=3.2)
    write_run(tmp_path / "sampled", 0.7, {
        "plain": plain,
        "smollm2-135m-fast": {"gsm8k": 5.0, "qa": 5.0, "rag": 6.0},
        "smollm2-135m-slow": {"gsm8k": 9.0, "qa": 9.0, "rag": 9.0},
    }, tau=2.0)
    done = check(tmp_path / "greedy", tmp_path / "sampled")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {line.split(" | ")[0].strip("| "): line for line in done.stdout.splitlines() if line.startswith("|")}
    assert lines["GSM8K speedup"].endswith("| 3.33x ✓ | 2.00x |")
    assert "1.25x (rag) |" in lines["lowest Spec-Bench category speedup"]
    assert lines["overall speedup, T=0.7"].endswith("| 1.88x ✓ | 1.11x |")
    assert "meeting every criterion: smollm2-135m-fast." in done.stdout


def test_acceptance_check_needs_a_greedy_and_a_sampled_run(tmp_path):
    write_run(tmp_path / "a", 0.7, {"plain": {"gsm8k": 1.0}, "smollm2-135m-x": {"gsm8k": 1.0}}, tau=1.0)
    done = check(tmp_path / "a", tmp_path / "a")
    assert done.returncode != 0 and "need a greedy and a sampled run" in done.stderr
