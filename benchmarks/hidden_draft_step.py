"""Time one hidden-state draft step (one new row after a 200-row context) and the output layer over
5 rows, with the draft's projections as they are and as int8 (`--draft-quant`). bf16, 2 threads.

    .venv/bin/python benchmarks/hidden_draft_step.py --hidden-draft runs/hidden_state/smollm2-self-long/draft
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.drafters.factory import DrafterWeights
from foretell.models.hidden_draft import load_hidden_draft
from foretell.models.loading import load_model

CONTEXT, CHAIN, ROUNDS = 200, 5, 300


def time_draft(draft) -> tuple[float, float]:
    """Seconds per chain step and per output-layer call over CHAIN rows."""
    cache = draft.new_cache(CONTEXT + CHAIN + 1)
    with torch.inference_mode():
        draft.step(torch.randn(CONTEXT, draft.config.hidden_size, dtype=draft.dtype), cache)
        cache.commit_prefix(CONTEXT)
        row = torch.randn(1, draft.config.hidden_size, dtype=draft.dtype)
        for _ in range(20):  # warm-up
            draft.step(row, cache)
        start = time.perf_counter()
        for _ in range(ROUNDS):
            x = row
            for _ in range(CHAIN):
                x = draft.step(x, cache)
                cache.commit_prefix(1)
            cache.truncate(CONTEXT)
        step = (time.perf_counter() - start) / (ROUNDS * CHAIN)
        rows = torch.randn(CHAIN, draft.config.hidden_size, dtype=draft.dtype)
        start = time.perf_counter()
        for _ in range(ROUNDS):
            draft.logits(rows)
        head = (time.perf_counter() - start) / ROUNDS
    return step, head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-draft", required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--hot-vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.model, "bfloat16", "cpu")
    hot = DrafterWeights(target, args.model).hot_vocab(args.hot_vocab)
    print("| draft projections | ms per draft step | ms for the output layer over 5 rows |")
    print("|---|---:|---:|")
    for mode in ("none", "int8"):
        draft = load_hidden_draft(args.hidden_draft, target.model, hot).quantize(mode)
        step, head = time_draft(draft)
        print(f"| {'bf16' if mode == 'none' else 'int8'} | {step * 1e3:.2f} | {head * 1e3:.2f} |")


if __name__ == "__main__":
    main()
