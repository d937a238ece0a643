"""Seconds of one hidden-state draft training sequence (forward + backward of sequence_terms) for SmolLM2-135M,
320 tokens, 32 KL anchors, by unrolled depth, with every row unrolled (the seed's recipe) and with only the
anchors unrolled past step 1 (--deep-rows anchors); fp32 and, with --bf16, under bf16 autocast as --bf16 trains;
with --draft-vocab N, a draft that scores only its own N tokens (train hidden-state --draft-vocab N).
A training step is --batch-size (16) such sequences.

    .venv/bin/python benchmarks/train/hidden_train_step.py [--threads 2] [--bf16] [--draft-vocab 8192]
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.models.hidden_draft import HiddenDraftConfig, new_hidden_draft
from foretell.runtime.loading import load_model
from foretell.train.hidden_state.loss import HiddenLossConfig, sequence_terms

T, ANCHORS, TOPK = 320, 32, 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="under bf16 autocast (the recipes' --bf16)")
    ap.add_argument("--draft-vocab", type=int, default=0, help="the draft's own vocabulary size (0: the target's)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model("smollm2-135m", "float32").model
    config = HiddenDraftConfig.for_target(target.config, draft_vocab_size=args.draft_vocab)
    draft = new_hidden_draft(target, config, init_from_layer=15)
    draft.requires_grad_(True)
    target.requires_grad_(False)  # the shared output layer and embedding stay frozen, as in training
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(T, target.config.hidden_size, generator=g)
    tokens = torch.randint(0, target.config.vocab_size, (T,), generator=g)
    logp = torch.log_softmax(torch.randn(T, TOPK, generator=g), -1)
    ids = torch.randint(0, target.config.vocab_size, (T, TOPK), generator=g)
    mask = torch.ones(T, dtype=torch.bool)
    anchors = torch.randperm(T - 6, generator=g)[:ANCHORS].sort().values
    print(f"| depth | every row (s / sequence) | anchors only (s / sequence) | ratio |  ({'bf16 autocast' if args.bf16 else 'fp32'}, "
          f"{args.threads} threads, CPU {torch.backends.cpu.get_cpu_capability()}, "
          f"{'draft vocabulary ' + str(args.draft_vocab) if args.draft_vocab else 'whole vocabulary'})")
    print("|---:|---:|---:|---:|")
    for depth in (1, 3, 5):
        best = {}
        for rows in ("all", "anchors"):
            cfg = HiddenLossConfig(deep_rows=rows, anchors=ANCHORS)
            times = []
            for _ in range(3):
                start = time.perf_counter()
                with torch.autocast("cpu", torch.bfloat16, enabled=args.bf16):
                    t = sequence_terms(draft, hidden, logp, ids, tokens, mask, depth, anchors, cfg,
                                       torch.Generator().manual_seed(1))
                    loss = t.mse.sum() + t.kl.sum()
                loss.backward()
                times.append(time.perf_counter() - start)
            best[rows] = min(times)
        print(f"| {depth} | {best['all']:.3f} | {best['anchors']:.3f} | {best['all'] / best['anchors']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
