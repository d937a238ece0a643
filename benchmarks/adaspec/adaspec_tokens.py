"""Where AdaSPEC's draft gains or loses against plain distillation: per-token acceptance on held-out text,
bucketed by how sure the target is (its top probability), plus greedy agreement (argmax match, what greedy
speculative decoding accepts).

    python benchmarks/adaspec/adaspec_tokens.py --data runs/self_data/smollm2-gsm8k-test.jsonl \
        --draft all=DIR --draft adaspec=DIR [--num-sequences 48] [--json OUT.json]

Prints a markdown table; alpha per bucket is sum_v min(p, q) at temperature 1, averaged over the bucket's tokens.
"""

from __future__ import annotations

import argparse
import json

import torch

from foretell.runtime.loading import build_model, load_tokenizer, resolve_model_dir
from foretell.train.adaspec.evaluate import acceptance_per_token, format_table, teacher_forced_logits
from foretell.train.common.data import DataConfig, build_token_data

BUCKETS = [(0.0, 0.3), (0.3, 0.6), (0.6, 0.9), (0.9, 0.99), (0.99, 1.01)]


def per_token(target, drafts: dict, data, batch_size: int = 4) -> dict[str, torch.Tensor]:
    """Flat per-token tensors over the trained positions: target top probability, and per draft alpha and
    argmax agreement."""
    out: dict[str, list[torch.Tensor]] = {"p_top": []}
    for name in drafts:
        out[f"{name}:alpha"], out[f"{name}:greedy"] = [], []
    for p_logits, q_logits, mask in teacher_forced_logits(target, drafts, data, batch_size, desc="tokens"):
        p_logits = p_logits.float()
        out["p_top"].append(torch.softmax(p_logits, -1).amax(-1)[mask])
        p_arg = p_logits.argmax(-1)
        for name, q in q_logits.items():
            out[f"{name}:alpha"].append(acceptance_per_token(p_logits, q)[mask])
            out[f"{name}:greedy"].append((q.argmax(-1) == p_arg)[mask].float())
    return {k: torch.cat(v) for k, v in out.items()}


def table(values: dict[str, torch.Tensor], names: list[str]) -> tuple[str, list[dict]]:
    rows = []
    for low, high in [*BUCKETS, (0.0, 1.01)]:
        sel = (values["p_top"] >= low) & (values["p_top"] < high)
        row = {"target_top_p": "all" if (low, high) == (0.0, 1.01) else f"[{low}, {min(high, 1.0)})",
               "share": round(float(sel.float().mean()), 3)}
        for name in names:
            row[f"{name} alpha"] = round(float(values[f"{name}:alpha"][sel].mean()), 4) if sel.any() else None
            row[f"{name} greedy"] = round(float(values[f"{name}:greedy"][sel].mean()), 4) if sel.any() else None
        rows.append(row)
    return format_table(rows, list(rows[0])), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--data", required=True)
    parser.add_argument("--draft", action="append", required=True, help="NAME=FOLDER (repeatable)")
    parser.add_argument("--num-sequences", type=int, default=48)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    target_dir = resolve_model_dir(args.target)
    data = build_token_data(DataConfig(args.data, "test", args.num_sequences, args.seq_len), load_tokenizer(target_dir))
    drafts = dict(item.split("=", 1) for item in args.draft)
    models = {name: build_model(resolve_model_dir(path), torch.float32) for name, path in drafts.items()}
    values = per_token(build_model(target_dir, torch.float32), models, data)
    text, rows = table(values, list(drafts))
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
