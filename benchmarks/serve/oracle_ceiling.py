"""The most speculation could win under a batched load on this machine: an oracle drafter against plain batching.

A plain batched run records every request's greedy answer; the oracle then drafts, for each request, the next
tokens of that very answer (always accepted). No drafter can propose better or more cheaply (it costs nothing and
is never wrong), so its tokens/s against plain batching at the same clients bounds what any real drafter can reach
with this target, these kernels and this load: the prompts' passes and the cost of each verified row are the
limits it leaves. Runs in process (no HTTP), as batch_profile.py does; plain and oracle take turns, --rounds times.

    OMP_NUM_THREADS=2 FORETELL_DATA=/work/shared/data .venv/bin/python benchmarks/serve/oracle_ceiling.py \
        --quant gguf-q8 --dtype float32 --clients 4 --requests 24 --max-tokens 128 --per-category 2 \
        [--budgets auto,fixed:1,fixed:2,fixed:4] [--rounds 2] [--out DIR]

--out writes DIR/results.json (every round's figures) and DIR/report.md (the ratios, median over rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from foretell.api import load
import foretell.batching as batching
from foretell.bench.datasets import load_prompts
from foretell.drafters.base import DrafterBase, empty_proposal
from foretell.sizing.batch import BatchAwareBudget, FixedByBatchSize
from foretell.sizing.chain import FixedLength
from foretell.types import Proposal, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_profile import timed_forward  # noqa: E402  (a sibling script)


class OracleDrafter(DrafterBase):
    """Drafts the recorded plain answer of whichever recorded sequence (prompt + answer) the context is a prefix of."""

    name = "oracle"

    def __init__(self, sequences: list[list[int]]):
        self.sequences = sequences
        self.current: list[int] = []

    def start(self, prompt_ids, capacity, params: SamplingParams, generator) -> None:
        prompt = list(prompt_ids)
        self.current = next((s for s in self.sequences if s[:len(prompt)] == prompt), [])

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        n = len(tokens)
        if max_tokens <= 0 or self.current[:n] != tokens:
            return empty_proposal()
        return Proposal(tokens=torch.tensor(self.current[n:n + max_tokens], dtype=torch.long))


def serve(batch, prompts, clients: int, requests: int, max_tokens: int, seconds: dict) -> dict:
    """Keep `clients` requests active until `requests` finished; tokens/s, tokens a step, and each request's answer."""
    tokens, answers, sent, steps = [0], {}, 0, 0
    for key in seconds:
        seconds[key] = 0.0

    def on_chunk_of(number: int):
        def on_chunk(chunk):
            tokens[0] += len(chunk.tokens)
            answers.setdefault(number, []).extend(chunk.tokens)
            if chunk.result is not None:
                done.add(number)
        return on_chunk

    done: set[int] = set()
    start = time.perf_counter()
    while len(done) < requests:
        while sent < requests and sent - len(done) < clients:
            batch.submit(prompts[sent % len(prompts)], SamplingParams(max_new_tokens=max_tokens), on_chunk_of(sent),
                         print)
            sent += 1
        batch.step()
        steps += 1
    wall = time.perf_counter() - start
    return {"tok_s": tokens[0] / wall, "tokens_step": tokens[0] / steps, "wall": wall, "answers": answers,
            "prompt_share": seconds["of which prompt passes"] / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quant", default="gguf-q8")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--prefill-chunk", type=int, default=256,
                   help="prompt tokens a pass (default: %(default)s, as the recorded runs read them)")
    p.add_argument("--budgets", default="auto,fixed:1,fixed:2,fixed:4",
                   help="auto: foretell's batch-aware budget; fixed:N: N oracle tokens a request every step")
    p.add_argument("--gamma", type=int, default=8, help="the most oracle tokens a request offers the budget")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="a folder for results.json and report.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pipe = load(args.model, "none", dtype=args.dtype, quant=args.quant)
    prompts = [pipe.encode(x["prompt"]) for x in load_prompts(["spec-bench"], args.per_category)]
    seconds = {"forward": 0.0, "of which prompt passes": 0.0}
    timed_forward(seconds)  # the time of every target pass, and of those carrying a prompt chunk
    plain_engine = pipe.plain_engine()

    def plain():
        return serve(batching.BatchEngine(pipe.target.model, lambda: plain_engine, None, args.clients,
                                          args.prefill_chunk), prompts, args.clients, args.requests, args.max_tokens,
                     seconds)

    reference = plain()  # a warm-up that records the answers
    sequences = [prompts[n % len(prompts)] + reference["answers"][n] for n in sorted(reference["answers"])]
    oracle_engine = replace(plain_engine, drafter=None, length_policy=FixedLength(args.gamma))

    def oracle(budget: str):
        policy = (BatchAwareBudget(cost=pipe.weights.target_cost()) if budget == "auto"
                  else FixedByBatchSize((64,), (int(budget.split(":")[1]),)))
        batch = batching.BatchEngine(pipe.target.model, lambda: replace(oracle_engine, drafter=OracleDrafter(sequences)),
                                     policy, args.clients, args.prefill_chunk)
        return serve(batch, prompts, args.clients, args.requests, args.max_tokens, seconds)

    budgets = args.budgets.split(",")
    for budget in budgets:  # warm-up: the cost model's first passes
        oracle(budget)
    ratios: dict[str, list[float]] = {b: [] for b in budgets}
    rounds: list[dict] = []
    print(f"{args.clients} clients, {args.requests} requests of {args.max_tokens} tokens, {args.quant} {args.dtype}, "
          f"{args.threads} threads", flush=True)
    for round_ in range(args.rounds):
        base = plain()
        rounds.append({"plain": figures(base), "oracle": {}})
        print(f"round {round_ + 1}: plain {base['tok_s']:.1f} tok/s ({base['tokens_step']:.2f} tokens a step, "
              f"prompt passes {base['prompt_share']:.0%} of the time)", flush=True)
        for budget in budgets:
            run = oracle(budget)
            if run["answers"] != base["answers"]:
                raise SystemExit(f"oracle with budget {budget} changed an answer: not lossless")
            ratios[budget].append(run["tok_s"] / base["tok_s"])
            rounds[-1]["oracle"][budget] = figures(run)
            print(f"  oracle budget={budget}: {run['tok_s']:.1f} tok/s ({run['tokens_step']:.2f} tokens a step, "
                  f"prompt passes {run['prompt_share']:.0%}), {ratios[budget][-1]:.3f}x plain", flush=True)
    lines = [f"oracle budget={budget} / plain: median {statistics.median(ratios[budget]):.3f} over {args.rounds} "
             f"rounds ({', '.join(f'{r:.3f}' for r in ratios[budget])})" for budget in budgets]
    print("\n".join(lines))
    if args.out:
        write_report(args, rounds, ratios)


def figures(run: dict) -> dict:
    return {k: round(run[k], 4) for k in ("tok_s", "tokens_step", "wall", "prompt_share")}


def joined(values, digits: int = 1) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def write_report(args, rounds: list[dict], ratios: dict[str, list[float]]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    (args.out / "results.json").write_text(json.dumps({"settings": settings, "rounds": rounds}, indent=1) + "\n")
    plain = [r["plain"] for r in rounds]
    table = ["| drafter, budget | tok/s by round | tokens a step | prompt passes' share | / plain by round | median |",
             "|---|---|---:|---:|---|---:|",
             f"| plain batching | {joined(r['tok_s'] for r in plain)} | {plain[0]['tokens_step']:.2f} | "
             f"{statistics.mean(r['prompt_share'] for r in plain):.0%} | | |"]
    for budget, values in ratios.items():
        runs = [r["oracle"][budget] for r in rounds]
        table.append(f"| oracle, {budget} | {joined(r['tok_s'] for r in runs)} | "
                     f"{statistics.mean(r['tokens_step'] for r in runs):.2f} | "
                     f"{statistics.mean(r['prompt_share'] for r in runs):.0%} | "
                     f"{joined(values, 3)} | {statistics.median(values):.3f} |")
    head = (f"# Oracle drafter against plain batching: {args.clients} clients\n\n"
            f"{args.model} ({args.quant}, {args.dtype}), {args.requests} Spec-Bench requests ({args.per_category} a "
            f"category) of {args.max_tokens} tokens, greedy, {args.threads} threads, in process; plain and oracle in "
            f"turns, {args.rounds} rounds after a warm-up of each. The oracle drafts each request's recorded plain "
            f"answer (never wrong, free), up to {args.gamma} tokens a request a step; every oracle answer equalled "
            "plain's.\n\n")
    (args.out / "report.md").write_text(head + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
