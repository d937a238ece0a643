"""Seed 000's checklist for a trained hidden-state draft: token-info load time and the share of decoding
time spent resampling (the held-out hidden MSE is in the training run's eval.md).

    .venv/bin/python benchmarks/bench/hidden_state_checklist.py --hidden-draft runs/hidden_state/smollm2-self-long2/draft

Token-info: E(t) = W_E[t] W_1 W_2 is computed per tree node from the low-rank factors, or read from a
precomputed table of the hot tokens; the table's build time is the "load time", set against its memory and
against the per-node cost without it. Resampling: GSM8K test prompts decoded with the drafter (bf16, greedy);
the drafter times its resampling step, reported as a share of the whole generation time.
"""

from __future__ import annotations

import argparse
import time

import torch

from foretell.api import load
from foretell.config import SpeculativeConfig
from foretell.bench.datasets import load_prompts
from foretell.models.token_info import TokenInfoTable


def per_node_seconds(draft, tokens: list[int]) -> float:
    t0 = time.perf_counter()
    for t in tokens:
        draft.info(torch.tensor([t], dtype=torch.long))
    return (time.perf_counter() - t0) / len(tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden-draft", required=True)
    p.add_argument("--hot-vocab", type=int, default=8192)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    pipe = load("smollm2-135m", SpeculativeConfig(method='hidden-state', model=str(args.hidden_draft), hot_vocab=args.hot_vocab, draft_quant="none"), dtype="bfloat16")
    drafter = pipe.engine.drafter
    draft = drafter.draft
    columns = draft.output_ids.tolist() if draft.output_ids is not None else list(range(draft.config.vocab_size))
    print("## Token-info load time\n")
    print("| E rows | how | seconds | memory MB |\n|---|---|---:|---:|")
    with torch.no_grad():
        for size in (1024, len(columns)):
            table = TokenInfoTable.build(columns[:size], lambda t: draft.info(torch.tensor(t, dtype=torch.long)))
            print(f"| {size} hot tokens | precomputed table | {table.build_seconds:.3f} | {table.nbytes() / 2**20:.1f} |")
        one = per_node_seconds(draft, columns[:200])
    print(f"| one token | from the factors, per tree node | {one:.6f} | 0 |\n")

    print("## Share of decoding time spent resampling (GSM8K test, bf16, greedy)\n")
    print("| prompt | new tokens | tau | resampled subtrees | accepted only via resampling | resample s | total s | share |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    totals = [0, 0.0, 0.0]
    for i, row in enumerate(load_prompts(["gsm8k"], args.prompts)):
        result = pipe.generate(row["prompt"], max_new_tokens=args.max_new_tokens)
        s, h = result.stats, drafter.stats
        totals[0] += h.resampled_subtrees
        totals[1] += h.resample_seconds
        totals[2] += s.total_seconds
        print(f"| {i} | {s.new_tokens} | {s.tau:.2f} | {h.resampled_subtrees} | {h.accepted_resampled_only} | "
              f"{h.resample_seconds:.3f} | {s.total_seconds:.2f} | {h.resample_seconds / s.total_seconds:.2%} |")
    print(f"\nOverall: {totals[0]} resampled subtrees, {totals[1]:.3f} s of {totals[2]:.1f} s = "
          f"{totals[1] / totals[2]:.2%} of the decoding time.")


if __name__ == "__main__":
    main()
