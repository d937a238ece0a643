"""What the A/B scripts (wide_fp32_ab.py, bf16_kernel_ab.py) share: their options, a cost-curve row, and the
generation speed of several pipelines taking turns prompt by prompt, so that a machine whose speed drifts during
the run slows every pipeline alike."""

from __future__ import annotations

import argparse
import time

import torch

from foretell.budget import measure_cost_curve

SIZES = (1, 2, 4, 8, 16, 32, 64)


def parse_ab_args(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2, help="prompts per category (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def curve_row(name: str, model) -> None:
    """One Markdown row: ms per forward of `model` at each of SIZES tokens (context 256)."""
    ms = [s * 1000 for s in measure_cost_curve(model, sizes=SIZES, repeats=3).seconds]
    print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in ms) + " |", flush=True)


def interleaved_rates(groups: dict, prompts: list[dict], max_new_tokens: int) -> dict[str, float]:
    """Tokens per second of each pipeline in `groups` (name -> Pipeline) over `prompts` (load_prompts rows)."""
    seconds, tokens = dict.fromkeys(groups, 0.0), dict.fromkeys(groups, 0)
    for i, prompt in enumerate(prompts):
        for key, pipe in groups.items():
            start = time.perf_counter()
            result = pipe.generate(prompt["prompt"], max_new_tokens=max_new_tokens)
            seconds[key] += time.perf_counter() - start
            tokens[key] += len(result.tokens)
        print(f"prompt {i + 1}/{len(prompts)}", flush=True)
    return {key: tokens[key] / seconds[key] for key in groups}


def print_rates(rate: dict[str, float], base: str, same_as, columns: tuple[str, str]) -> None:
    """A Markdown table: tok/s, the ratio to `base`, and to `same_as(name)` (the plain run of the same variant)."""
    print(f"\n| method | tok/s | {columns[0]} | {columns[1]} |\n|---|---:|---:|---:|")
    for key, value in rate.items():
        print(f"| {key} | {value:.1f} | {value / rate[base]:.2f}x | {value / rate[same_as(key)]:.2f}x |")
