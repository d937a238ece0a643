"""Where an EAGLE-3 head's drafting time goes on the 8-bit fast path (SmolLM2-135M, `--quant gguf-q8`).

    .venv/bin/python benchmarks/bench/head_draft_split.py [--draft-quant int8] [--budget auto] [--per 1]

Part 1 decodes GSM8K + Spec-Bench prompts (PER a category, 128 tokens, greedy) with the shipped head and, in the same
run, plainly; it times each proposal's pieces by wrapping them (the code under test is unchanged): the head's native
steps (the feed of the committed rows, then one step a tree level, by rows), fc over the target's features, the
children's ranking, and the rest (Python: the tree's bookkeeping, masks, the scheduler). Part 2 (run first, before
the wrapping) times one native step alone at 1, 4 and 8 rows over a 400-row context, whole (step_and_logits) and the kernel call alone, with and
without the output layer: the arithmetic a row costs against what is spent around it. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.drafters import eagle_tree
from foretell.runtime import lean_drafters
from foretell.runtime.lean_step import visible_slots
from foretell.types import SamplingParams


class Timings:
    """Total seconds and calls by name."""

    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.calls[name] += 1

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.add(name, time.perf_counter() - start)
            return out
        return timed


def instrument(timings: Timings) -> None:
    """Wrap the head's native step (named by its kind and rows), fc and the ranking of children."""
    step = lean_drafters.LeanEagle3Step.__call__

    def native_step(self, embeds, hidden, positions, cache, tree_mask, last_only=False):
        start = time.perf_counter()
        out = step(self, embeds, hidden, positions, cache, tree_mask, last_only)
        rows = hidden.shape[0]
        kind = "feed" if tree_mask is None else "tree level"
        timings.add(f"native step, {kind}, {rows if rows < 8 else '8+'} rows", time.perf_counter() - start)
        return out

    lean_drafters.LeanEagle3Step.__call__ = native_step
    lean_drafters.LeanEagle3Step.fuse = timings.wrap("fc (column kernel)", lean_drafters.LeanEagle3Step.fuse)
    eagle_tree.Eagle3Drafter._top = timings.wrap("ranking the children", eagle_tree.Eagle3Drafter._top)


def per_pass(args, base, prompts) -> None:
    spec = {"method": "eagle3", "model": "smollm2-135m-eagle3", "draft_quant": args.draft_quant}
    if args.budget != "none":
        spec["budget"] = args.budget
    pipe = base.with_speculative(spec)
    timings = Timings()
    instrument(timings)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    warm = SamplingParams(max_new_tokens=16)
    pipe.engine.generate(prompts[0], warm)
    base.engine.generate(prompts[0], warm)
    timings.seconds.clear()
    timings.calls.clear()
    tokens = passes = plain_tokens = 0
    draft = spec_seconds = plain_seconds = 0.0
    for ids in prompts:  # interleaved: the two see the same machine state
        s = pipe.engine.generate(ids, params).stats
        tokens, passes = tokens + s.new_tokens, passes + s.target_passes
        draft, spec_seconds = draft + s.draft_seconds, spec_seconds + s.decode_seconds
        p = base.engine.generate(ids, params).stats
        plain_tokens, plain_seconds = plain_tokens + p.new_tokens, plain_seconds + p.decode_seconds
    step = plain_seconds / plain_tokens
    print(f"## Drafting a pass ({spec}, {len(prompts)} prompts)\n")
    print(f"Plain step {1000 * step:.2f} ms; speculative {tokens / spec_seconds:.1f} tok/s against plain "
          f"{plain_tokens / plain_seconds:.1f} ({plain_seconds / plain_tokens * tokens / spec_seconds:.3f}x), tau "
          f"{tokens / passes:.2f}; drafting {1000 * draft / passes:.2f} ms a pass = {draft / passes / step:.2f} of a "
          "plain step.\n")
    print("| piece | calls a pass | ms a call | ms a pass | share of drafting |")
    print("|---|---:|---:|---:|---:|")
    for name in sorted(timings.seconds):
        seconds, calls = timings.seconds[name], timings.calls[name]
        print(f"| {name} | {calls / passes:.2f} | {1000 * seconds / calls:.3f} | {1000 * seconds / passes:.3f} | "
              f"{seconds / draft:.0%} |")
    rest = draft - sum(timings.seconds.values())
    print(f"| the rest (Python around them) | | | {1000 * rest / passes:.3f} | {rest / draft:.0%} |\n")


def one_step(args, base) -> None:
    pipe = base.with_speculative({"method": "eagle3", "model": "smollm2-135m-eagle3", "draft_quant": args.draft_quant})
    head = pipe.engine.drafter.head
    lean = head.lean
    context, H = 400, head.config.hidden_size
    cache = head.new_cache(context + 64)
    gen = torch.Generator().manual_seed(0)
    for start in range(0, context, 16):  # a context of 400 committed rows
        rows = torch.arange(start, start + 16)
        head.step_and_logits(torch.randint(0, 1000, (16,), generator=gen), torch.randn(16, H, generator=gen), rows,
                             cache)
        cache.commit_prefix(16)

    def ms(fn, repeats=300) -> float:
        for _ in range(20):
            fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return 1000 * (time.perf_counter() - start) / repeats

    print(f"## One native step over a {context}-row context ({args.draft_quant})\n")
    print("| rows | step_and_logits | kernel call | kernel call without the output layer |")
    print("|---:|---:|---:|---:|")
    for rows in (1, 4, 8):
        tokens = torch.randint(0, 1000, (rows,), generator=gen)
        hidden = torch.randn(rows, H, generator=gen)
        positions = torch.full((rows,), context + 1)
        mask = torch.ones(rows, rows, dtype=torch.bool).tril()

        def whole():
            head.step_and_logits(tokens, hidden, positions, cache, mask)
            cache.truncate(context)

        cos, sin = head.rotary(positions, int(positions.max()), torch.float32)
        embeds = head.embed(tokens).float().contiguous()
        visible = visible_slots(mask, rows, cache.length)
        shared = (lean.tensors,)
        rest = (lean.heads, lean.kv_heads, lean.eps, lean.act_q8)

        def kernel(head_weights, kinds):
            return lambda: lean.kernel(hidden, cos, sin, cache.k, cache.v, cache.length, visible, *shared,
                                       head_weights, kinds, *rest, embeds, lean.side_norm)

        print(f"| {rows} | {ms(whole):.3f} | {ms(kernel(lean.head, lean.kinds)):.3f} | "
              f"{ms(kernel(lean.head[:1], lean.kinds[:-1])):.3f} |")
    print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft-quant", default="int8", choices=("int8", "int4"))
    p.add_argument("--budget", default="auto", help="the tree's budget: auto (the shipped setting) or none")
    p.add_argument("--per", type=int, default=1, help="prompts per category (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    base = load("smollm2-135m", "none", quant="gguf-q8", dtype="float32")
    prompts = [base.encode(r["prompt"]) for r in load_prompts(["gsm8k", "spec-bench"], args.per)]
    one_step(args, base)  # before per_pass wraps the step
    per_pass(args, base, prompts)


if __name__ == "__main__":
    main()
