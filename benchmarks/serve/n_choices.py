"""Requests for n choices through the batching engine, with and without the prefix cache, in process (no HTTP).

    OMP_NUM_THREADS=2 FORETELL_DATA=/work/shared/data .venv/bin/python benchmarks/serve/n_choices.py \
        [--n 4] [--requests 2] [--per-category 1] [--max-tokens 64] [--rounds 2] [--out DIR]

A request for n choices (OpenAI's `n`) is n sequences of one prompt, each its own request in the batch, as
`foretell serve` submits them. Without the prefix cache each reads the prompt itself; with it, the first reads it
and the others wait for its rows (BatchEngine._follows) and read only the prompt's last token. Spec-Bench prompts,
`--requests` requests at a time (closed loop), n choices each, sampled at temperature 0.8 with seeds (choice i:
seed + i), so both configurations give the same tokens (checked). The two configurations take turns `--rounds`
times, each on a fresh engine. Prints and writes (OUT/report.md, OUT/results.json) the mean time to each choice's
first token, the prompt tokens the target read, and tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cache_off_on import OFF, ON, add_run_args, off_and_on, write_report
from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.prefix_cache import PrefixCache
from foretell.types import SamplingParams


def serve(pipe, prompts: list[list[int]], n: int, requests: int, max_tokens: int, cache_mb: int) -> dict:
    """Every prompt as a request for n choices, `requests` at a time."""
    batch = pipe.batch_engine(None, max_batch=n * requests, prefix_cache=PrefixCache.of_megabytes(cache_mb))
    ttft, read, answers = [], [], {}
    queue = list(range(len(prompts)))
    open_choices: dict[int, int] = {}

    def send(index: int) -> None:
        open_choices[index] = n
        sent = time.perf_counter()
        for choice in range(n):
            tokens: list[int] = []
            params = SamplingParams(max_new_tokens=max_tokens, temperature=0.8, seed=1000 * index + choice)

            def on_chunk(chunk, tokens=tokens, choice=choice) -> None:
                if not tokens and chunk.tokens:
                    ttft.append(time.perf_counter() - sent)
                tokens.extend(chunk.tokens)
                if chunk.result is not None:
                    stats = chunk.result.stats
                    read.append(stats.prompt_tokens - stats.cached_prompt_tokens)
                    answers[index, choice] = list(tokens)
                    open_choices[index] -= 1
                    if not open_choices[index] and queue:
                        send(queue.pop(0))

            batch.submit(prompts[index], params, on_chunk, print)

    start = time.perf_counter()
    for _ in range(min(requests, len(queue))):
        send(queue.pop(0))
    batch.run()
    wall = time.perf_counter() - start
    return {"wall_seconds": round(wall, 2), "tokens_per_second": round(sum(map(len, answers.values())) / wall, 2),
            "ttft_mean": round(statistics.mean(ttft), 4), "prompt_tokens_read": sum(read),
            "answers": [answers[key] for key in sorted(answers)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, "runs/n_choices")
    p.add_argument("--n", type=int, default=4, help="choices a request (default: %(default)s)")
    p.add_argument("--requests", type=int, default=2, help="requests at a time (default: %(default)s)")
    p.add_argument("--per-category", type=int, default=1, help="Spec-Bench prompts a category (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pipe = load(args.model, None if args.drafter == "default" else args.drafter, dtype=args.dtype, quant=args.quant)
    prompts = [pipe.encode(x["prompt"]) for x in load_prompts(["spec-bench"], args.per_category)]
    serve(pipe, prompts[:2], args.n, args.requests, 8, 0)  # warm-up: first touches of the weights and buffers
    runs = off_and_on(lambda on: serve(pipe, prompts, args.n, args.requests, args.max_tokens,
                                       args.cache_mb if on else 0), args.rounds, "seeded choices")
    lines = [f"{len(prompts)} Spec-Bench prompts, {args.n} choices each (temperature 0.8, seeded), {args.requests} "
             f"requests at a time, {args.max_tokens} tokens a choice, {args.model} {args.quant} {args.dtype}, drafter "
             f"{args.drafter}; medians over {args.rounds} rounds.", "",
             "| configuration | mean TTFT (s) | prompt tokens read | tokens/s |", "|---|---:|---:|---:|"]
    summary = {}
    for name, group in runs.items():
        summary[name] = {key: statistics.median(run[key] for run in group)
                         for key in ("ttft_mean", "prompt_tokens_read", "tokens_per_second")}
        s = summary[name]
        lines.append(f"| {name} | {s['ttft_mean']:.3f} | {s['prompt_tokens_read']:.0f} | {s['tokens_per_second']:.1f} |")
    off, on = summary[OFF], summary[ON]
    lines += ["", f"With the cache: TTFT {on['ttft_mean'] / off['ttft_mean']:.2f}x, prompt tokens read "
                  f"{on['prompt_tokens_read'] / off['prompt_tokens_read']:.2f}x, tokens/s "
                  f"{on['tokens_per_second'] / off['tokens_per_second']:.2f}x."]
    write_report(args.out, args, summary, runs, lines)


if __name__ == "__main__":
    main()
