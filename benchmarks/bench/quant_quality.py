"""What quantizing the target costs: int8 / int4 / GGUF-kept weights against the bf16 model, on held-out text.

    .venv/bin/python benchmarks/bench/quant_quality.py [--model smollm2-135m] [--texts 48] [--prompts 2]
        [--targets none,int8,int4,gguf,gguf@float32,gguf-q8]

Teacher-forced on the target's own held-out answers (runs/self_data/smollm2-mix-test.jsonl, from
benchmarks/train/self_data.sh: GSM8K and ShareGPT test prompts): perplexity of the answer tokens, and how often the
quantized model's top-1 next token equals bf16's. Then greedy generation from GSM8K + Spec-Bench prompts: the share
of prompts whose 128-token output is identical to bf16's, and the mean number of tokens before the first difference.
Prints a Markdown table (each row one model, in one run). A target is QUANT[@DTYPE][/KV] (activations in bf16
unless given; the -q8 modes, 8-bit activations through the lean step, load in float32; KV: the KV cache's dtype,
e.g. gguf-q8/float16, else the model's).

    .venv/bin/python benchmarks/bench/quant_quality.py --targets gguf-q8,gguf-q8/float16   # a float16 KV cache
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.train.common.data import tokenize_conversation
from foretell.types import SamplingParams


@torch.inference_mode()
def teacher_forced(model, sequences: list[tuple[list[int], list[bool]]]) -> tuple[list[torch.Tensor], float]:
    """Per sequence the top-1 predictions at answer positions, and the mean negative log-likelihood there."""
    nll, count, tops = 0.0, 0, []
    for ids, flags in sequences:
        if model.lean is not None and model.lean.act_q8:  # that model is the lean step's passes (prompts in chunks)
            logits = model(torch.tensor(ids), torch.arange(len(ids)), model.new_cache(len(ids))).logits
        else:
            logits = model.forward_sequences(torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        target = torch.tensor(ids[1:])
        mask = torch.tensor(flags[1:])
        nll -= float(logp[mask, target[mask]].sum())
        count += int(mask.sum())
        tops.append(logits[:-1][mask].argmax(-1))
    return tops, nll / count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--texts", type=int, default=48)
    p.add_argument("--prompts", type=int, default=2, help="per GSM8K / Spec-Bench category (default: %(default)s)")
    p.add_argument("--data", default="runs/self_data/smollm2-mix-test.jsonl")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--targets", default="none,int8,int4,gguf,gguf@float32,gguf-q8",
                   help="QUANT[@DTYPE][/KV] per row, the first the reference (default: %(default)s)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()[: args.texts]]
    pipes = {}
    for target in args.targets.split(","):
        target, _, kv = target.partition("/")
        quant, _, dtype = target.partition("@")
        dtype = dtype or ("float32" if quant.endswith("-q8") else "bfloat16")
        pipes[(quant, dtype, kv)] = load(args.model, "none", dtype=dtype, quant=quant, kv_dtype=kv or None)
    reference_pipe = next(iter(pipes.values()))
    tokenizer = reference_pipe.tokenizer
    sequences = [tokenize_conversation(tokenizer, r["messages"]) for r in rows]
    prompts = [reference_pipe.encode(r["prompt"]) for r in load_prompts(["gsm8k", "spec-bench"], args.prompts)]
    params = SamplingParams(max_new_tokens=128)
    reference = None
    first_quant, first_dtype, _ = next(iter(pipes))
    ref = first_dtype if first_quant == "none" else f"{first_quant}@{first_dtype}"
    print(f"| {args.model} weights | perplexity | top-1 = {ref} | greedy output = {ref} | tokens before first "
          "difference |")
    print("|---|---:|---:|---:|---:|")
    for (quant, dtype, kv), pipe in pipes.items():
        tops, nll = teacher_forced(pipe.target.model, sequences)
        outputs = [pipe.engine.generate(ids, params).tokens for ids in prompts]
        if reference is None:
            reference = (tops, outputs)
        agree = sum(int((a == b).sum()) for a, b in zip(tops, reference[0])) / sum(len(t) for t in tops)
        same = sum(o == r for o, r in zip(outputs, reference[1])) / len(outputs)
        first = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r)))
                 for o, r in zip(outputs, reference[1])]
        name = {"none": dtype, "gguf": "gguf (the file's own Q4_1 blocks)",
                "gguf-q8": "gguf-q8 (Q4_1 blocks, 8-bit activations)"}.get(quant, f"{quant} (weight-only)")
        if quant != "none" and not quant.endswith("-q8"):
            name += f", {dtype} activations"
        if kv:
            name += f", {kv} KV cache"
        print(f"| {name} | {math.exp(nll):.3f} | {agree:.3f} | {same:.2f} | {sum(first) / len(first):.1f} |")


if __name__ == "__main__":
    main()
