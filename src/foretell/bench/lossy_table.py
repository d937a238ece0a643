"""The cost of the LOSSY mode, beside the speed it buys: agreement with plain decoding and GSM8K accuracy.

Written by `foretell bench` as OUT/lossy.md when a run has *-lossy-T methods. Every foretell
method of the run gets a row, so lossless ones (plain, parallel-head) are the reference.
Agreement compares each output with plain decoding's on the same prompt (greedy runs): the
share of plain's tokens reproduced before the first divergence, and the exact-match rate.
GSM8K accuracy compares the last number of the decoded output with the gold answer.
"""

from __future__ import annotations

import re
from pathlib import Path

from foretell.bench.datasets import read_jsonl
from foretell.bench.report import prompt_key, throughput
from foretell.bench.runner import RESULTS, read_rows
from foretell.errors import ForetellError
from foretell.paths import shared_data_dir

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> str | None:
    """The answer a GSM8K-style output commits to: the number after '####' if any, else its last number."""
    marked = text.rsplit("####", 1)
    found = NUMBER.findall(marked[1] if len(marked) == 2 else text)
    if not found:
        return None
    value = (found[0] if len(marked) == 2 else found[-1]).replace(",", "")
    if "." in value:  # 18.00 and 18 are the same answer
        value = value.rstrip("0").rstrip(".")
    return value


def gsm8k_gold(path: Path | None = None) -> dict[str, str]:
    """Gold answers of GSM8K test by bench id (the line number, as load_gsm8k numbers them)."""
    path = Path(path or shared_data_dir() / "gsm8k" / "test.jsonl")
    if not path.is_file():
        raise ForetellError(f"GSM8K not found at {path}; set FORETELL_DATA to the folder holding gsm8k/test.jsonl")
    return {str(i): final_number(r["answer"]) for i, r in enumerate(read_jsonl(path))}


def prefix_agreement(tokens: list[int], reference: list[int]) -> float:
    """Share of the reference's tokens reproduced before the first divergence (1.0 = identical)."""
    if not reference:
        return 1.0 if not tokens else 0.0
    same = 0
    for a, b in zip(tokens, reference):
        if a != b:
            break
        same += 1
    return same / len(reference)


def lossy_rows(rows: list[dict], decode, gold: dict[str, str] | None) -> list[dict]:
    """One summary per foretell method (rows with the monitoring counters), in order of appearance."""
    plain = {prompt_key(r): r for r in rows if r["method"] == "plain"}
    by_method: dict[str, list[dict]] = {}
    for r in rows:
        if "draft_passes" in r:  # foretell methods only (transformers / llama.cpp peers lack the counters)
            by_method.setdefault(r["method"], []).append(r)
    out = []
    for method, mrows in by_method.items():
        common = [r for r in mrows if prompt_key(r) in plain]
        base = throughput([plain[prompt_key(r)] for r in common])
        graded = [r for r in mrows if r["dataset"] == "gsm8k" and gold and gold.get(str(r["id"])) is not None]
        correct = sum(final_number(decode(r["tokens"])) == gold[str(r["id"])] for r in graded)
        new_tokens = sum(r["new_tokens"] for r in mrows)
        out.append({
            "method": method, "prompts": len(mrows),
            "speedup": throughput(common) / base if common and base else None,
            "agreement": sum(prefix_agreement(r["tokens"], plain[prompt_key(r)]["tokens"]) for r in common) / len(common)
            if common else None,
            "exact": sum(r["tokens"] == plain[prompt_key(r)]["tokens"] for r in common) / len(common) if common else None,
            "gsm8k_accuracy": correct / len(graded) if graded else None,
            "unverified_share": sum(r.get("lossy_accepted") or 0 for r in mrows) / new_tokens if new_tokens else 0.0,
        })
    return out


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def lossy_markdown(summaries: list[dict]) -> str:
    lines = [
        "# LOSSY verification: speed against agreement with the target", "",
        "Agreement: share of plain decoding's tokens reproduced before the first divergence (mean over prompts); "
        "exact: outputs identical to plain's; unverified: share of output tokens the target never checked.", "",
        "| method | prompts | speedup | agreement with plain | exact match | GSM8K accuracy | unverified tokens |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(f"| {s['method']} | {s['prompts']} | {_fmt(s['speedup'], '.2f')}{'x' if s['speedup'] else ''} | "
                     f"{_fmt(s['agreement'], '.3f')} | {_fmt(s['exact'], '.2f')} | {_fmt(s['gsm8k_accuracy'], '.2f')} | "
                     f"{s['unverified_share']:.2f} |")
    return "\n".join(lines) + "\n"


def write_lossy_table(out_dir: Path, tokenizer, gold_path: Path | None = None) -> Path:
    """OUT/lossy.md from OUT/results.jsonl; GSM8K accuracy only when GSM8K rows and its answers are there."""
    out_dir = Path(out_dir)
    rows = read_rows(out_dir / RESULTS)
    gold = gsm8k_gold(gold_path) if any(r["dataset"] == "gsm8k" for r in rows) else None
    decode = lambda tokens: tokenizer.decode(tokens, skip_special_tokens=True)  # noqa: E731
    path = out_dir / "lossy.md"
    path.write_text(lossy_markdown(lossy_rows(rows, decode, gold)))
    return path
