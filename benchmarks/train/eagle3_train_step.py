"""Seconds of one EAGLE-3 head training sequence for SmolLM2-135M (forward + backward of the training-time test as
train eagle3 runs it: 320 tokens, 32 anchors, 3 steps, KL over the 8192-token draft vocabulary), in fp32 and under
bf16 autocast (the recipes' --bf16). A training step is 16 such sequences. On a CPU without native bf16 the autocast
column says why benchmarks/train/shipped_data.sh's bf16_flag trains in fp32 there.

    .venv/bin/python benchmarks/train/eagle3_train_step.py [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.models.eagle3 import Eagle3Config, new_eagle3_head
from foretell.runtime.loading import load_model
from foretell.runtime.wide_linear import native_bf16
from foretell.train.common.draft_vocab import draft_vocab_kl
from foretell.train.eagle3.loss import column_map

T, ANCHORS, TOPK, STEPS, BATCH = 320, 32, 32, 3, 16


def sequence_seconds(head, features, ids, anchors, logp, top_ids, columns, bf16: bool, repeats: int) -> float:
    """The fastest of `repeats` forward + backward passes of one sequence."""
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            states = head.forward_training(features, ids, anchors, STEPS)[0]
            kl = draft_vocab_kl(head.logits(states), logp, columns[top_ids])
        kl.sum().backward()
        times.append(time.perf_counter() - start)
    return min(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model("smollm2-135m", "float32").model
    head = new_eagle3_head(target, Eagle3Config.for_target(target.config, 8192, (2, 15, 28)))
    head.requires_grad_(True).train()
    g = torch.Generator().manual_seed(0)
    features = torch.randn(1, T, 3 * target.config.hidden_size, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, target.config.vocab_size, (1, T + STEPS + 1), generator=g)
    anchors = torch.randperm(T - STEPS - 1, generator=g)[:ANCHORS].sort().values
    logp = torch.log_softmax(torch.randn(ANCHORS, STEPS, TOPK, generator=g), -1)
    top_ids = torch.randint(0, target.config.vocab_size, (ANCHORS, STEPS, TOPK), generator=g)
    columns = column_map(head)
    print(f"EAGLE-3 head training, {args.threads} threads, CPU {torch.backends.cpu.get_cpu_capability()}, "
          f"native bf16: {'yes' if native_bf16() else 'no'}")
    print("| precision | s / sequence | s / step of 16 |\n|---|---:|---:|")
    for bf16 in (False, True):
        s = sequence_seconds(head, features, ids, anchors, logp, top_ids, columns, bf16, args.repeats)
        print(f"| {'bf16 autocast' if bf16 else 'fp32'} | {s:.3f} | {s * BATCH:.1f} |", flush=True)


if __name__ == "__main__":
    main()
