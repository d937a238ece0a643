"""Time a hidden-state draft's chain as the bench runs it on SmolLM2-135M: one step over 3 new target rows after a
200-row context, then 4 steps over its own predictions, then the output layer over the 5 predictions; PyTorch's
path against the lean step (runtime/lean_drafters.LeanDraftLayers), with the draft's layer as it is and as int8. The
target loads as the bench loads it (bf16 weights, float32 activations where this CPU emulates bf16 products).
A draft folder is optional: the timing does not depend on the weights (default: a random draft with an
8192-token vocabulary, the shipped drafters' size).

    .venv/bin/python benchmarks/bench/hidden_draft_step.py [--hidden-draft runs/hidden_state/.../draft]
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.models.hidden_draft import HiddenDraftConfig, load_hidden_draft, new_hidden_draft
from foretell.runtime.drafter_modules import quantize_drafter, use_lean_step
from foretell.runtime.lean_step import run_bf16_as_float32
from foretell.runtime.loading import load_model

CONTEXT, NEW_ROWS, CHAIN, ROUNDS = 200, 3, 5, 200


def time_chain(draft) -> tuple[float, float]:
    """Milliseconds per chain's steps and per output-layer call over its CHAIN predictions."""
    H = draft.config.hidden_size
    cache = draft.new_cache(CONTEXT + NEW_ROWS + CHAIN + 1)
    rows = torch.randn(NEW_ROWS, H, dtype=draft.dtype)
    with torch.inference_mode():
        draft.step(torch.randn(CONTEXT, H, dtype=draft.dtype), cache)
        cache.commit_prefix(CONTEXT)
        steps = head = 0.0
        for round_ in range(ROUNDS + 10):  # 10 warm-up rounds
            t0 = time.perf_counter()
            chain = [draft.step(rows, cache)[-1:]]
            cache.commit_prefix(NEW_ROWS)
            for _ in range(CHAIN - 1):
                chain.append(draft.step(chain[-1], cache))
                cache.commit_prefix(1)
            t1 = time.perf_counter()
            draft.logits(torch.cat(chain))
            t2 = time.perf_counter()
            cache.truncate(CONTEXT)
            if round_ >= 10:
                steps, head = steps + t1 - t0, head + t2 - t1
    return steps / ROUNDS * 1e3, head / ROUNDS * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-draft", help="a saved draft (default: a random one of the shipped size)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.model, "bfloat16", "cpu").model
    run_bf16_as_float32(target)
    print(f"| draft layer | path | ms for the chain's {CHAIN} steps | ms for the output layer over {CHAIN} rows |"
          " ms in all |")
    print("|---|---|---:|---:|---:|")
    for mode in ("none", "int8"):
        if args.hidden_draft:
            draft = load_hidden_draft(args.hidden_draft, target)
        else:
            config = HiddenDraftConfig.for_target(target.config, draft_vocab_size=8192)
            draft = new_hidden_draft(target, config, draft_vocab=torch.arange(0, 3 * 8192, 3))
        quantize_drafter(draft, mode)
        for lean in (False, True):
            reason = use_lean_step(draft, lean)
            if reason:
                print(f"| {mode} | lean step | not run: {reason} | | |")  # e.g. no kernel built here
                continue
            steps, head = time_chain(draft)
            path = "lean step" if lean else "PyTorch"
            print(f"| {'as trained' if mode == 'none' else 'int8'} | {path} | {steps:.2f} | {head:.2f} | "
                  f"{steps + head:.2f} |", flush=True)


if __name__ == "__main__":
    main()
