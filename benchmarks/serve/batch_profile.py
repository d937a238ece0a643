"""Where a batched step's time goes, in process (no HTTP): C requests kept active on Spec-Bench prompts until N
have finished, for each budget policy; prints tokens/s, tokens per step and the seconds spent in the target's
packed forward (and of that, in passes carrying a prompt chunk), in drafting (BatchEngine._draft_all: every ready
request's proposal, the drafters' forwards packed) and in verification (Decoding.settle), then the time to first
token and the waits between a request's chunks of tokens (p50, p90 / p99). A diagnostic, not a test.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/serve/batch_profile.py [DRAFTER|default|none] [--budgets auto,fixed,none]
        (fixed:N: N draft tokens a request at any batch size)
        [--quant gguf-q8 --dtype float32 --kv-dtype float16] [--draft qwen2.5-coder-0.5b --draft-quant gguf-q8 --hot-vocab 32768]

DRAFTER none: plain batched decoding (the reference a speculative figure divides by).
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.api import load
import foretell.batching as batching
from foretell.bench.datasets import load_prompts
from foretell.config import SpeculativeConfig
import foretell.decoding as decoding
from foretell.prefix_cache import PrefixCache
from foretell.runtime.config import KV_DTYPES
from foretell.sizing.batch import BatchAwareBudget, FixedByBatchSize
from foretell.types import SamplingParams


def timed(owner, name: str, seconds: dict, key: str) -> None:
    """Wrap owner.name so that its calls add their time to seconds[key]."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def timed_forward(seconds: dict) -> None:
    """Wrap the batch's target pass (batching.forward_packed): its time goes to seconds["forward"], and that of the
    passes carrying a prompt chunk (a prefill asks no logits) to seconds["of which prompt passes"] too: the share
    of the time that speculation cannot shorten, as every server computes its prompts alike."""
    inner = batching.forward_packed

    def wrapper(target, passes):
        start = time.perf_counter()
        try:
            return inner(target, passes)
        finally:
            spent = time.perf_counter() - start
            seconds["forward"] += spent
            if any(p.logits_rows == slice(0, 0) for p in passes):
                seconds["of which prompt passes"] += spent

    batching.forward_packed = wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafter", nargs="?", default="default",
                   help="a method name, a speculative configuration file (JSON, e.g. benchmarks/specs/answers.json), "
                   "or default (the target's)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--budgets", default="auto,fixed,none")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--per-category", type=int, default=3, help="Spec-Bench prompts a category (default: %(default)s)")
    p.add_argument("--prefill-chunk", type=int, default=256, help="prompt tokens a pass (default: %(default)s)")
    p.add_argument("--prefix-cache-mb", type=int, default=0,
                   help="MiB of prompt prefixes kept across requests (the server's default: 512); 0: off, every "
                   "request reads its whole prompt, as serve_batching.py measures by default (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quant", default="none")
    p.add_argument("--kv-dtype", choices=KV_DTYPES[1:], help="the target's KV cache (default: the model's)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--draft", help="a draft model for DRAFTER draft-model (e.g. qwen2.5-coder-0.5b)")
    p.add_argument("--draft-quant", default="auto")
    p.add_argument("--hot-vocab", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    spec = None if args.drafter == "default" else args.drafter
    if args.drafter.endswith(".json"):
        spec = SpeculativeConfig.from_file(args.drafter)
    if args.draft:
        spec = SpeculativeConfig(method=args.drafter, model=args.draft, draft_quant=args.draft_quant,
                                 hot_vocab=args.hot_vocab)
    pipe = load(args.model, spec, dtype=args.dtype, quant=args.quant, kv_dtype=args.kv_dtype)
    prompts = [pipe.encode(x["prompt"]) for x in load_prompts(["spec-bench"], args.per_category)]
    seconds = {"forward": 0.0, "of which prompt passes": 0.0, "draft": 0.0, "settle": 0.0, "admit": 0.0}
    timed(batching.BatchEngine, "_draft_all", seconds, "draft")
    timed(batching.BatchEngine, "_admit", seconds, "admit")  # each admitted request's start: its KV cache
    timed(decoding.Decoding, "settle", seconds, "settle")
    timed_forward(seconds)
    policies = {"auto": lambda: BatchAwareBudget(cost=pipe.weights.target_cost()), "fixed": FixedByBatchSize,
                "none": lambda: None}
    for budget in args.budgets.split(","):
        if budget.startswith("fixed:"):  # N draft tokens a request whatever the batch (up to 64 requests)
            policy = FixedByBatchSize((64,), (int(budget.split(":")[1]),))
        else:
            policy = policies[budget]()
        prefixes = PrefixCache.of_megabytes(args.prefix_cache_mb)  # fresh for each budget
        batch = pipe.batch_engine(policy, max_batch=args.clients, prefill_chunk=args.prefill_chunk,
                                  prefix_cache=prefixes)
        tokens, finished, sent, steps = [0], [0], 0, 0
        for key in seconds:
            seconds[key] = 0.0

        submitted, first_token, last_token = {}, {}, {}  # request number -> its submission time, its tokens'
        gaps: list[float] = []  # the waits between a request's chunks of tokens

        def on_chunk_of(number: int):
            def on_chunk(chunk):
                if chunk.tokens:
                    now = time.perf_counter()
                    if number in last_token:
                        gaps.append(now - last_token[number])
                    else:
                        first_token[number] = now
                    last_token[number] = now
                tokens[0] += len(chunk.tokens)
                finished[0] += chunk.result is not None
            return on_chunk

        start = time.perf_counter()
        while finished[0] < args.requests:
            while sent < args.requests and sent - finished[0] < args.clients:
                submitted[sent] = time.perf_counter()
                batch.submit(prompts[sent % len(prompts)], SamplingParams(max_new_tokens=args.max_tokens),
                             on_chunk_of(sent), print)
                sent += 1
            batch.step()
            steps += 1
        wall = time.perf_counter() - start
        split = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
        ttft = sorted(first_token[n] - submitted[n] for n in first_token)
        split += f"; TTFT p50 {ttft[len(ttft) // 2]:.2f} s, p90 {ttft[int(len(ttft) * 0.9)]:.2f} s" if ttft else ""
        gaps.sort()
        split += (f"; between chunks p50 {gaps[len(gaps) // 2] * 1e3:.0f} ms, p99 {gaps[int(len(gaps) * 0.99)] * 1e3:.0f} ms"
                  if gaps else "")
        print(f"{pipe.speculative.method} budget={budget}: {tokens[0] / wall:.1f} tokens/s, {tokens[0] / steps:.2f} "
              f"tokens/step, {batch.budget_stats.kept / steps:.2f} drafts verified a step (of "
              f"{batch.budget_stats.proposed / steps:.2f} proposed), {wall:.1f} s ({split})"
              + (f", prompt tokens from the prefix cache {prefixes.stats.reused_tokens}" if prefixes else ""), flush=True)


if __name__ == "__main__":
    main()
