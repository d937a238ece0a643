"""Where a generated token's time goes: the target's forward, drafting, verification arithmetic, the rest.

    .venv/bin/python benchmarks/bench/token_split.py [--model smollm2-135m] [--quant none] [--spec-config NAME=FILE ...]

Per method (plain decoding, prompt lookup, and any --spec-config), over GSM8K + Spec-Bench prompts (PER a
category), bf16 (or --dtype): milliseconds per generated token spent in the target's forward passes (timed by hooks on the
target module), in the drafter's propose, in verification outside the forward (acceptance rule, cache commit,
bookkeeping), and everything else in the loop (stop checks, detokenization, the result cache). Prefill is left
out. "outside forward" is all but the forward: the loop's own cost per token. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.config import SpeculativeConfig
from foretell.runtime.quant import TARGET_QUANT_CHOICES
from foretell.types import SamplingParams


class ForwardTimer:
    """The duration of each call of a module's forward (hooks: no change to the code it times)."""

    def __init__(self, module: torch.nn.Module):
        self.calls: list[float] = []
        self._start = 0.0
        module.register_forward_pre_hook(lambda *_: setattr(self, "_start", time.perf_counter()))
        module.register_forward_hook(lambda *_: self.calls.append(time.perf_counter() - self._start))


def split(pipe, prompts: list[list[int]], params: SamplingParams, timer: ForwardTimer) -> dict[str, float]:
    totals = dict(tokens=0, forward=0.0, draft=0.0, verify=0.0, decode=0.0)
    for ids in prompts:
        timer.calls = []
        stats = pipe.engine.generate(ids, params).stats
        assert len(timer.calls) == stats.target_passes + (len(ids) > 1)  # the prefill's forward comes first
        totals["tokens"] += stats.new_tokens
        totals["forward"] += sum(timer.calls[len(ids) > 1:])
        totals["draft"] += stats.draft_seconds
        totals["verify"] += stats.verify_seconds
        totals["decode"] += stats.decode_seconds
    return totals


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quant", default="none", choices=TARGET_QUANT_CHOICES)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--per", type=int, default=2, help="prompts per category (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--spec-config", action="append", default=[], metavar="NAME=FILE")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    methods = {"plain": SpeculativeConfig(method="none"), "prompt-lookup": SpeculativeConfig()}
    for entry in args.spec_config:
        name, _, path = entry.partition("=")
        methods[name] = SpeculativeConfig.from_file(path)
    base = load(args.model, "none", dtype=args.dtype, quant=args.quant)
    timer = ForwardTimer(base.engine.target)
    prompts = [base.encode(r["prompt"]) for r in load_prompts(["gsm8k", "spec-bench"], args.per)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    print(f"| method ({args.model}, {args.quant} weights, {args.dtype}) | tokens | ms / token | forward | drafting | "
          "verification outside forward | other | outside forward |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, spec in methods.items():
        pipe = base.with_speculative(spec)
        pipe.engine.generate(prompts[0], SamplingParams(max_new_tokens=8))  # warm-up
        t = split(pipe, prompts, params, timer)
        ms = {k: 1000 * v / t["tokens"] for k, v in t.items() if k != "tokens"}
        other = ms["decode"] - ms["draft"] - ms["verify"]
        print(f"| {name} | {t['tokens']} | {ms['decode']:.2f} | {ms['forward']:.2f} | {ms['draft']:.2f} | "
              f"{ms['verify'] - ms['forward']:.2f} | {other:.2f} | {ms['decode'] - ms['forward']:.2f} |")


if __name__ == "__main__":
    main()
