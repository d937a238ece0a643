"""The EAGLE-3 head's native step against its PyTorch step, end to end: tok/s of decoding with the shipped head,
its lean step on and off in turn, beside plain decoding, on the same target and prompts (interleaved rounds).

    .venv/bin/python benchmarks/lean_head_ab.py [--quant gguf-q8] [--per 1] [--rounds 2] [--max-new-tokens 96]

Float32 target (the lean step's); budget "auto", no result cache (it would remember earlier rounds). With an
8-bit-activation target (gguf-q8) the head's lean step reads 8-bit activations too; it is also timed with float
ones. Checks every output against plain decoding's. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.config import SpeculativeConfig
from foretell.types import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--head", default="smollm2-135m-eagle3")
    p.add_argument("--quant", default="gguf-q8")
    p.add_argument("--per", type=int, default=1, help="prompts per GSM8K / Spec-Bench category")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    base = load(args.model, "none", dtype="float32", quant=args.quant)
    pipe = base.with_speculative(SpeculativeConfig(method="eagle3", model=args.head, budget="auto"))
    head = pipe.engine.drafter.head
    if head.lean is None:
        raise SystemExit(f"the head does not step natively here: {head.use_lean_step()}")
    plain = base.with_speculative(SpeculativeConfig(method="none"))
    prompts = [base.encode(r["prompt"]) for r in load_prompts(["gsm8k", "spec-bench"], args.per)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    want = [plain.engine.generate(x, params).tokens for x in prompts]
    act_q8 = head.lean.act_q8  # the target's 8-bit activations reach the head's int8 projections too
    steps = {"EAGLE-3 head, lean step": (True, act_q8), "EAGLE-3 head, PyTorch step": (False, False)}
    if act_q8:
        steps["EAGLE-3 head, lean step, float activations"] = (True, False)
    runs = {"plain": [], **{name: [] for name in steps}}
    passes = {name: [0, 0] for name in runs}  # tokens, target passes (tau = their ratio)
    for _ in range(args.rounds):
        for name in runs:
            engine = plain.engine if name == "plain" else pipe.engine
            if name != "plain":
                head.use_lean_step(*steps[name])
            start, tokens = time.perf_counter(), 0
            for x, w in zip(prompts, want):
                result = engine.generate(x, params)
                if result.tokens != w:
                    raise SystemExit(f"{name}: output differs from plain decoding")
                tokens += len(result.tokens)
                passes[name][0] += result.stats.tau * result.stats.target_passes
                passes[name][1] += result.stats.target_passes
            runs[name].append(tokens / (time.perf_counter() - start))
    print(f"| {args.model}, {args.quant}, {len(prompts)} prompts x {args.max_new_tokens} tokens | tok/s (mean of "
          f"{args.rounds} rounds) | vs plain | tau |")
    print("|---|---:|---:|---:|")
    plain_rate = sum(runs["plain"]) / args.rounds
    for name, rates in runs.items():
        rate = sum(rates) / len(rates)
        tau = passes[name][0] / max(passes[name][1], 1)
        print(f"| {name} | {rate:.1f} | {rate / plain_rate:.2f}x | {tau:.2f} |")


if __name__ == "__main__":
    main()
