"""A bf16 target's lean passes on AMX tiles (bf16 products, BF16A) against AVX-512 columns (fp32 products, BF16X).

    .venv/bin/python benchmarks/amx_ab.py [--model smollm2-135m] [--threads 2] [--repeats 9]

On a CPU with AMX a bf16 target's lean passes multiply on its tiles (kernels/lean_decode.cpp, tiles_amx): ~16x
the products of AVX-512's FMAs a cycle, so a verification pass of 16 or 32 tokens costs about what streaming the
weights once does. Prints a Markdown table of ms per forward of 1-64 tokens after a 256-token context, both
configurations measured in this one run, interleaved (medians of --repeats), and each size's ratio to a one-token
step. Then what the tiles' numbers cost: over one text fed a token at a time, each configuration's logits against
the float32 model's (mean and largest distance, and how often its top token is the float32 model's), beside
PyTorch's bf16 path.
"""

from __future__ import annotations

import torch

from compile_ab import ab_args, timer  # benchmarks/ is on the path when this runs as a script
from foretell.api import load
from foretell.kernels import amx_products, lean_module

SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
TEXT = ("Speculative decoding lets a small drafter propose several tokens that the large model then checks in one "
        "pass. Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.")


def step_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """[len(ids) - 1, V]: the logits after each prefix, one token a step (the first token as the prompt)."""
    cache = model.new_cache(len(ids) + 1)
    rows = []
    with torch.inference_mode():
        for i in range(len(ids)):
            out = model(ids[i:i + 1], torch.tensor([i]), cache).logits.float()
            cache.commit_prefix(1)
            if i:
                rows.append(out)
    return torch.cat(rows)


def quality_table(args, models: dict) -> None:
    pipe = load(args.model, "none", dtype="float32", warm_up=False)
    ids = torch.tensor(pipe.encode(TEXT, chat=False))
    reference = step_logits(pipe.target.model, ids)
    print(f"\n{len(ids) - 1} one-token steps of one text; logits against the float32 model's\n")
    print("| configuration | mean distance | largest | top token = float32's |")
    print("|---|---:|---:|---:|")
    for name, model in models.items():
        logits = step_logits(model, ids)
        gap = (logits - reference).abs()
        same = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
        print(f"| {name} | {gap.mean().item():.4f} | {gap.max().item():.3f} | {same:.1%} |", flush=True)


def main() -> None:
    args = ab_args(__doc__, repeats=9)
    if not amx_products():
        raise SystemExit("this CPU has no AMX tiles (or Linux grants no tile state): nothing to compare here")
    amx = load(args.model, "none", dtype="bfloat16", warm_up=False).target.model
    lean_module().lean_amx(False)  # packed while off: the column layout
    columns = load(args.model, "none", dtype="bfloat16", warm_up=False).target.model
    lean_module().lean_amx(True)
    assert amx.lean.amx and not columns.lean.amx
    runs = {"AVX-512 columns, fp32 products": timer(columns, longest=max(SIZES)),
            "AMX tiles, bf16 products": timer(amx, longest=max(SIZES))}
    times = {name: {n: [] for n in SIZES} for name in runs}
    for n in SIZES:
        for _ in range(args.repeats):
            for name, run in runs.items():  # interleaved: the machine's drift hits both alike
                times[name][n].append(run(n))
    print(f"{args.model}, {args.threads} threads, ms per pass of n tokens after a 256-token context "
          f"(x: against that configuration's one-token step)\n")
    print("| n tokens | " + " | ".join(str(n) for n in SIZES) + " |")
    print("|---|" + "---:|" * len(SIZES))
    for name in runs:
        median = {n: sorted(t)[len(t) // 2] * 1000 for n, t in times[name].items()}
        print(f"| {name} | " + " | ".join(f"{median[n]:.1f} ({median[n] / median[1]:.2f}x)" for n in SIZES) + " |",
              flush=True)
    torch_bf16 = load(args.model, "none", dtype="bfloat16", lean=False, warm_up=False).target.model
    quality_table(args, {"PyTorch bf16": torch_bf16, **{name: model for name, model in
                                                         zip(runs, (columns, amx))}})


if __name__ == "__main__":
    main()
