"""The lean step against PyTorch's path: ms per forward of 1-16 tokens after a 256-token context, interleaved.

    .venv/bin/python benchmarks/lean_ab.py [--model smollm2-135m] [--quants gguf,int4,none] [--threads 2]

Per target weight format (float32 activations, where the lean step runs; models/lean_step.py): one model, its
passes timed with the lean step on and off in turn (the same weights, each with its own cache), median of
--repeats. Also times the same target in bf16 through PyTorch (what foretell ran before) for reference, and, on a
CPU whose bf16 products are emulated, the bf16 target as foretell now runs it there: float32 activations over its
bf16 weights in the lean step. A "-q8"
format (gguf-q8: 8-bit activations) times its lean passes against the same weights' float-activation lean passes
and against its own blocks read one output column at a time (the layout before the column-interleaved one). A
dense model whose weights are bf16 numbers (quant none from a bf16 checkpoint) also times its lean step reading them
as fp32 (before the bf16 kinds).
Prints a Markdown table.
"""

from __future__ import annotations

import argparse

import torch

from compile_ab import timer as pass_timer  # benchmarks/ is on the path when this runs as a script
from foretell.api import load
from foretell.models.lean_step import BF16, BF16X, LeanStep
from foretell.models.quant import split_target_quant

SIZES = (1, 2, 4, 6, 7, 8, 16, 32)


def timer(model, lean_step):
    """compile_ab's pass timer (a 256-token context, prefilled through PyTorch), with the lean step or without."""
    model.lean = None
    once = pass_timer(model)

    def run(n: int) -> float:
        model.lean = lean_step
        return once(n)

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quants", default="gguf,int4,none")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"| ms per forward ({args.model}, {args.threads} threads, context 256) | "
          + " | ".join(f"{n} tok" for n in SIZES) + " |")
    print("|---|" + "---:|" * len(SIZES))
    for quant in args.quants.split(","):
        runs = {}
        weights, act_q8 = split_target_quant(quant)
        if act_q8:  # 8-bit activations exist only in the lean step: its rows against float activations' lean rows
            model = load(args.model, "none", dtype="float32", quant=weights, warm_up=False).target.model
            model.use_lean_step()
            runs[f"{weights}, fp32 activations, lean step"] = timer(model, model.lean)
            q8 = load(args.model, "none", dtype="float32", quant=quant, warm_up=False).target.model
            step, rows = q8.lean, LeanStep(q8, act_q8=True, interleave=False)  # rows: one output column at a time
            runs[f"{weights}, 8-bit activations ({quant}), lean step, row blocks"] = timer(q8, rows)
            runs[f"{weights}, 8-bit activations ({quant}), lean step"] = timer(q8, step)
        else:
            bf16 = load(args.model, "none", dtype="bfloat16", quant=quant, lean=False, warm_up=False).target.model
            runs[f"{quant}, bf16 activations, PyTorch"] = timer(bf16, None)
            as_fp32 = load(args.model, "none", dtype="bfloat16", quant=quant, warm_up=False).target.model
            if as_fp32.lean is not None and as_fp32.lean.streams_bf16:  # bf16's default where bf16 is emulated
                runs[f"{quant}, bf16 weights, fp32 activations, lean step (bf16 target's default here)"] = timer(
                    as_fp32, as_fp32.lean)
            model = load(args.model, "none", dtype="float32", quant=quant, warm_up=False).target.model
            reason = model.use_lean_step()
            if reason is not None:
                print(f"| {quant}: {reason} |")
                continue
            step = model.lean
            runs[f"{quant}, fp32 activations, PyTorch"] = timer(model, None)
            runs[f"{quant}, fp32 activations, lean step"] = timer(model, step)
            if any(kind in (BF16, BF16X) for kind in step.kinds):  # bf16 numbers streamed as bf16: against fp32
                runs[f"{quant}, fp32 activations, lean step, weights read as fp32"] = timer(model,
                                                                                          LeanStep(model, bf16=False))
        times = {name: {n: [] for n in SIZES} for name in runs}
        for n in SIZES:
            for _ in range(args.repeats):
                for name, run in runs.items():  # interleaved: the machine's drift hits every row alike
                    times[name][n].append(run(n))
        for name in runs:
            cells = [f"{sorted(t)[len(t) // 2] * 1000:.1f}" for t in times[name].values()]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
