"""The Qwen section's table of docs/adaspec.md from a finished benchmarks/adaspec/adaspec_qwen.sh run folder.

alpha on held-out target answers (eval-alpha-{gsm8k,sharegpt}.json), then real draft-model decoding, greedy and
T=1, on GSM8K test and Spec-Bench prompts (eval-decode-{data,spec-bench}-t{0,1}-g*.json: each group of drafts
decoded beside plain decoding in its own run, so a speedup is against the plain run it was timed with).
    python benchmarks/adaspec/adaspec_qwen_table.py runs/adaspec-qwen     (writes OUT/table.md and prints it)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DECODED = {"data": "GSM8K test", "spec-bench": "Spec-Bench"}


def load_rows(out: Path, stem: str) -> list[dict]:
    rows = []
    for f in sorted(out.glob(f"{stem}-g*.json")) or [out / f"{stem}.json"]:
        if f.is_file():
            rows += json.loads(f.read_text())
    return rows


def table(out: Path) -> str:
    alpha = {held: {r["draft"]: r["alpha"] for r in json.loads((out / f"eval-alpha-{held}.json").read_text())}
             for held in ("gsm8k", "sharegpt")}
    drafts = list(alpha["gsm8k"])
    head = "| draft | alpha GSM8K | alpha general |"
    cols = []
    for source, name in DECODED.items():
        for temp, label in (("0", "greedy"), ("1", "T=1")):
            rows = {r["draft"]: r for r in load_rows(out, f"eval-decode-{source}-t{temp}")}
            if rows:
                cols.append((f"{name} {label}", rows))
    lines = [head + "".join(f" {c}: accept / tau / speedup |" for c, _ in cols),
             "|---|---:|---:|" + "---:|" * len(cols)]
    for d in drafts:
        cells = [f"{r[d]['acceptance_rate']:.2f} / {r[d]['tau']:.2f} / {r[d]['speedup']:.2f}x" if d in r else "–"
                 for _, r in cols]
        lines.append(f"| {d} | {alpha['gsm8k'][d]:.4f} | {alpha['sharegpt'][d]:.4f} |" + "".join(f" {c} |" for c in cells))
    order = sorted(drafts, key=lambda d: -alpha["gsm8k"][d])
    lines += ["", "Order by alpha on GSM8K: " + " > ".join(f"{d} ({alpha['gsm8k'][d]:.3f})" for d in order)
              + "; the paper's: AdaSPEC > all tokens > undistilled."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/adaspec-qwen")
    text = table(out)
    (out / "table.md").write_text(text)
    print(text)
