"""Seconds of one parallel-head training sequence (forward + backward of train/parallel_head/train.py's
sequence_terms) over the whole vocabulary and over a draft vocabulary of N tokens (train parallel-head
--draft-vocab N), side by side in one run: 320 tokens, 32 anchors, depth 4, fp32, a new head on the real target's
shapes and shared output layer (random features and teacher). A training step is --batch-size (16) such sequences.

    .venv/bin/python benchmarks/train/head_train_step.py [--target qwen2.5-coder-1.5b] [--vocab 0,32768,8192] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from foretell.models.parallel_head import ParallelHeadConfig, new_parallel_head
from foretell.runtime.loading import load_model
from foretell.train.common.data import TokenData
from foretell.train.common.draft_vocab import columns_of
from foretell.train.common.features import FeatureCache
from foretell.train.parallel_head.train import sequence_terms

T, ANCHORS, TOPK, DEPTH, REPEATS = 320, 32, 32, 4, 3


def random_run(target, fuse: int, generator: torch.Generator) -> tuple[FeatureCache, TokenData]:
    """One sequence's cached features and teacher (random, of the real shapes) and its tokens."""
    V = target.config.vocab_size
    features = (torch.randn(1, T, fuse, generator=generator) * 0.5).to(torch.bfloat16).view(torch.int16).numpy()
    logp = torch.log_softmax(torch.randn(1, T, TOPK, generator=generator) * 3, -1).sort(-1, descending=True).values
    ids = torch.randint(0, V, (1, T, TOPK), generator=generator)
    ids[..., 0] = torch.randint(0, 4096, (1, T), generator=generator)  # top-1s mostly frequent, as in real text
    tokens = torch.randint(0, V, (1, T), generator=generator)
    cache = FeatureCache(features, logp.numpy().astype(np.float32), ids.numpy().astype(np.int32))
    return cache, TokenData(tokens, torch.ones(1, T, dtype=torch.bool))


def seconds(target, draft_vocab: int, cache: FeatureCache, data: TokenData, anchors: torch.Tensor) -> float:
    config = ParallelHeadConfig.for_target(target.config, depth=DEPTH, draft_vocab_size=draft_vocab)
    head = new_parallel_head(target, config, draft_vocab=torch.arange(draft_vocab) if draft_vocab else None)
    columns = columns_of(head.vocab_ids, config.vocab_size) if draft_vocab else None
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        kl, valid, _ = sequence_terms(head, cache, data, 0, anchors, columns)
        (kl * valid).sum().backward()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--vocab", default="0,32768,8192", help="draft vocabulary sizes, 0 = the whole vocabulary")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.target, "float32").model
    target.requires_grad_(False)  # the shared output layer and embedding stay frozen, as in training
    g = torch.Generator().manual_seed(0)
    fuse = len(ParallelHeadConfig.for_target(target.config).fuse_layers) * target.config.hidden_size
    cache, data = random_run(target, fuse, g)
    anchors = torch.randperm(T - DEPTH - 1, generator=g)[:ANCHORS].sort().values
    sizes = [int(x) for x in args.vocab.split(",")]
    print(f"{args.target}, vocabulary {target.config.vocab_size}, {T} tokens, {ANCHORS} anchors, depth {DEPTH}, fp32, "
          f"{args.threads} threads, CPU {torch.backends.cpu.get_cpu_capability()}, best of {REPEATS}\n")
    print("| draft vocabulary | s / sequence | s / 16-sequence step | vs whole vocabulary |")
    print("|---:|---:|---:|---:|")
    base = None
    for size in sizes:
        s = seconds(target, size, cache, data, anchors)
        base = s if base is None and size == 0 else base
        ratio = f"{base / s:.2f}x faster" if base is not None and size else "-"
        print(f"| {size or 'whole'} | {s:.3f} | {16 * s:.1f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
