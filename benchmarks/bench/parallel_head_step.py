"""Time one parallel-head forward as the bench runs it on SmolLM2-135M: 3 new context rows and 3 placeholders after
a 200-row context, logits over the head's 8192 hot tokens; PyTorch's path against the lean step
(runtime/lean_drafters.LeanDraftLayers: its layer in one native call, fuse and the output rows in the column kernel).
The target loads as the bench loads it (bf16 weights, float32 activations where this CPU emulates bf16 products).

    .venv/bin/python benchmarks/bench/parallel_head_step.py [--head src/foretell/shipped/smollm2-135m-head]
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.build import DrafterWeights
from foretell.models.parallel_head import load_parallel_head
from foretell.runtime.drafter_modules import use_lean_step
from foretell.runtime.lean_step import run_bf16_as_float32
from foretell.runtime.loading import load_model

CONTEXT, NEW_ROWS, PLACEHOLDERS, ROUNDS = 200, 3, 3, 200


def time_forward(head) -> float:
    """Milliseconds per forward (its cache truncated back to the context after each)."""
    width = len(head.config.fuse_layers) * head.config.hidden_size
    g = torch.Generator().manual_seed(0)
    cache = head.new_cache(CONTEXT + NEW_ROWS + PLACEHOLDERS + 1)
    features, tokens = torch.randn(NEW_ROWS, width, generator=g), torch.randint(0, 1000, (NEW_ROWS,), generator=g)
    with torch.inference_mode():
        head(torch.randn(CONTEXT, width, generator=g), torch.randint(0, 1000, (CONTEXT,), generator=g), cache, 0)
        cache.commit_prefix(CONTEXT)
        total = 0.0
        for round_ in range(ROUNDS + 10):  # 10 warm-up rounds
            t0 = time.perf_counter()
            head(features, tokens, cache, PLACEHOLDERS, full_vocab=False)
            if round_ >= 10:
                total += time.perf_counter() - t0
            cache.truncate(CONTEXT)
    return total / ROUNDS * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", default="src/foretell/shipped/smollm2-135m-head")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--hot-vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.model, "bfloat16", "cpu")
    run_bf16_as_float32(target.model)
    head = load_parallel_head(args.head, target.model, DrafterWeights(target, args.model).hot_vocab(args.hot_vocab))
    print(f"| path | ms a forward ({NEW_ROWS} context rows, {PLACEHOLDERS} placeholders, {args.hot_vocab} hot tokens) |")
    print("|---|---:|")
    for lean in (False, True):
        reason = use_lean_step(head, lean)
        if reason:
            print(f"| lean step | not run: {reason} |")  # e.g. no kernel built here
            continue
        print(f"| {'lean step' if lean else 'PyTorch'} | {time_forward(head):.2f} |", flush=True)


if __name__ == "__main__":
    main()
