"""Core speed benchmark: foretell vs transformers on CPU, greedy, Spec-Bench prompts.

Part A (Qwen2.5-Coder 1.5B target, 0.5B draft): foretell plain and draft-model decoding,
transformers plain `generate` and assisted generation. Part B (SmolLM2-135M): foretell plain
and prompt-lookup decoding, transformers plain `generate`. Methods are interleaved per prompt
and every method gets the same chat-templated token ids.

    python benchmarks/core_speed.py --out benchmarks/results/core_speed.json > benchmarks/results/core_speed.md
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import transformers
from tqdm import tqdm
from transformers import AutoModelForCausalLM

import foretell
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.models.loading import parse_dtype, resolve_model_dir
from foretell.types import GenerationStats, SamplingParams

SPEC_BENCH = Path("/work/shared/data/spec_bench/question.jsonl")
SPEC_BENCH_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")  # + mt_bench
QWEN_TARGET, QWEN_DRAFT, SMOLLM = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"
WARMUP_TOKENS = 16

# A runner maps (prompt ids, max new tokens) to (new token ids, foretell's stats or None); the harness times it.
Runner = Callable[[list[int], int], tuple[list[int], GenerationStats | None]]


@dataclass
class Prompt:
    question_id: int
    category: str
    text: str


@dataclass
class MethodTotals:
    """One method's results summed over all prompts."""

    name: str
    reference: str | None = None  # method whose greedy output this one's is compared with
    new_tokens: int = 0
    seconds: float = 0.0
    target_passes: int = 0  # speculative methods only: pooled over prompts
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    same_as_reference: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    per_prompt: list[dict] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_tau(self) -> float | None:
        """Tokens per target pass, pooled over prompts."""
        if not self.target_passes:
            return None
        return (sum(self.accepted_per_position) + self.target_passes) / self.target_passes

    @property
    def acceptance_per_position(self) -> list[float]:
        return [round(a / p, 3) for a, p in zip(self.accepted_per_position, self.proposed_per_position)]


def load_prompts(per_category: int) -> list[Prompt]:
    """The first `per_category` prompts of each of Spec-Bench's six categories, in file order."""
    by_category: dict[str, list[Prompt]] = {}
    for line in SPEC_BENCH.read_text().splitlines():
        q = json.loads(line)
        category = q["category"] if q["category"] in SPEC_BENCH_CATEGORIES else "mt_bench"
        bucket = by_category.setdefault(category, [])
        if len(bucket) < per_category:
            bucket.append(Prompt(q["question_id"], category, q["turns"][0]))
    return [p for bucket in by_category.values() for p in bucket]


def foretell_runner(pipeline: foretell.Pipeline) -> Runner:
    def run(ids: list[int], max_new: int):
        result = pipeline.engine.generate(ids, SamplingParams(max_new_tokens=max_new))
        return result.tokens, result.stats if pipeline.engine.drafter is not None else None

    return run


def hf_runner(model, stop_ids: set[int], **extra) -> Runner:
    def run(ids: list[int], max_new: int):
        input_ids = torch.tensor([ids])
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new,
            eos_token_id=sorted(stop_ids), pad_token_id=min(stop_ids), **extra,
        )
        new = out[0, len(ids):].tolist()
        while new and new[-1] in stop_ids:  # foretell does not return the stop token
            new.pop()
        return new, None

    return run


def load_hf(preset: str, dtype: torch.dtype):
    folder = resolve_model_dir(preset)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def run_part(title: str, methods: dict[str, tuple[Runner, str | None]], prompts: list[list[int]],
             meta: list[Prompt], max_new: int) -> dict[str, MethodTotals]:
    """Warm each method up once, then run every method on prompt 1, then prompt 2, ..."""
    totals = {name: MethodTotals(name, reference) for name, (_, reference) in methods.items()}
    with torch.inference_mode():
        for name, (runner, _) in tqdm(methods.items(), desc=f"{title}: warm-up", file=sys.stderr):
            runner(prompts[0], min(WARMUP_TOKENS, max_new))
        bar = tqdm(total=len(prompts) * len(methods), desc=title, file=sys.stderr)
        for ids, prompt in zip(prompts, meta):
            for name, (runner, _) in methods.items():
                t0 = time.perf_counter()
                tokens, stats = runner(ids, max_new)
                seconds = time.perf_counter() - t0
                record(totals[name], tokens, stats, seconds, prompt, len(ids))
                bar.update()
        bar.close()
    for t in totals.values():
        if t.reference:
            t.same_as_reference = sum(a == b for a, b in zip(t.outputs, totals[t.reference].outputs))
    return totals


def record(t: MethodTotals, tokens: list[int], stats: GenerationStats | None, seconds: float, prompt: Prompt,
           n_in: int) -> None:
    t.new_tokens += len(tokens)
    t.seconds += seconds
    t.outputs.append(tokens)
    if stats is not None:
        t.target_passes += stats.target_passes
        for i, (p, a) in enumerate(zip(stats.proposed_per_position, stats.accepted_per_position)):
            if i == len(t.proposed_per_position):
                t.proposed_per_position.append(0)
                t.accepted_per_position.append(0)
            t.proposed_per_position[i] += p
            t.accepted_per_position[i] += a
    t.per_prompt.append({
        "question_id": prompt.question_id, "category": prompt.category, "prompt_tokens": n_in,
        "new_tokens": len(tokens), "seconds": round(seconds, 3),
        "tau": round(stats.tau, 3) if stats is not None else None,
    })


def part_a(args, dtype, prompts: list[Prompt]) -> tuple[dict[str, MethodTotals], list[tuple[str, str]]]:
    pipe = foretell.load(QWEN_TARGET, draft=QWEN_DRAFT, drafter="draft-model", dtype=dtype, gamma=args.gamma)
    plain = pipe.with_drafter(None)
    hf_target, hf_draft = load_hf(QWEN_TARGET, dtype), load_hf(QWEN_DRAFT, dtype)
    stop = pipe.engine.stop_ids
    ids = [pipe.encode(p.text, chat=True) for p in prompts]
    methods = {
        "foretell plain 1.5B": (foretell_runner(plain), None),
        f"foretell draft 0.5B (gamma {args.gamma})": (foretell_runner(pipe), "foretell plain 1.5B"),
        "transformers plain 1.5B": (hf_runner(hf_target, stop), "foretell plain 1.5B"),
        "transformers assisted 0.5B": (hf_runner(hf_target, stop, assistant_model=hf_draft), "transformers plain 1.5B"),
    }
    totals = run_part("Qwen", methods, ids, prompts, args.max_new_tokens)
    names = list(methods)
    speedups = [(names[1], names[0]), (names[3], names[2]), (names[0], names[2]), (names[1], names[3])]
    return totals, speedups


def part_b(args, dtype, prompts: list[Prompt]) -> tuple[dict[str, MethodTotals], list[tuple[str, str]]]:
    pipe = foretell.load(SMOLLM, drafter="none", dtype=dtype)
    pld = pipe.with_drafter(PromptLookupDrafter(), gamma=args.gamma)
    hf = load_hf(SMOLLM, dtype)
    ids = [pipe.encode(p.text, chat=True) for p in prompts]
    methods = {
        "foretell plain SmolLM2": (foretell_runner(pipe), None),
        f"foretell prompt-lookup SmolLM2 (gamma {args.gamma})": (foretell_runner(pld), "foretell plain SmolLM2"),
        "transformers plain SmolLM2": (hf_runner(hf, pipe.engine.stop_ids), "foretell plain SmolLM2"),
    }
    totals = run_part("SmolLM2", methods, ids, prompts, args.max_new_tokens)
    names = list(methods)
    return totals, [(names[1], names[0]), (names[0], names[2])]


def markdown(totals: dict[str, MethodTotals], speedups: list[tuple[str, str]], n_prompts: int) -> str:
    lines = [
        "| method | new tokens | seconds | tok/s | mean tau | same output as |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for t in totals.values():
        tau = f"{t.mean_tau:.2f}" if t.mean_tau is not None else "-"
        same = f"{t.reference}: {t.same_as_reference}/{n_prompts}" if t.reference else "-"
        lines.append(f"| {t.name} | {t.new_tokens} | {t.seconds:.1f} | {t.tokens_per_second:.2f} | {tau} | {same} |")
    lines += ["", "| speedup (tok/s ratio) | x |", "|---|---:|"]
    for a, b in speedups:
        lines.append(f"| {a} vs {b} | {ratio(totals, a, b):.2f} |")
    return "\n".join(lines)


def ratio(totals: dict[str, MethodTotals], a: str, b: str) -> float:
    return totals[a].tokens_per_second / totals[b].tokens_per_second


def to_json(totals: dict[str, MethodTotals], speedups: list[tuple[str, str]]) -> dict:
    methods = {}
    for t in totals.values():
        d = {k: v for k, v in asdict(t).items() if k != "outputs"}
        d.update(seconds=round(t.seconds, 3), tokens_per_second=round(t.tokens_per_second, 3),
                 mean_tau=None if t.mean_tau is None else round(t.mean_tau, 3),
                 acceptance_per_position=t.acceptance_per_position)
        methods[t.name] = d
    return {"methods": methods, "speedups": {f"{a} vs {b}": round(ratio(totals, a, b), 3) for a, b in speedups}}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts-per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=4, help="draft length for foretell's fixed policy")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--skip-qwen", action="store_true", help="skip part A (Qwen2.5-Coder 1.5B + 0.5B)")
    p.add_argument("--skip-smollm", action="store_true", help="skip part B (SmolLM2-135M)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/core_speed.json"))
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(2)
    transformers.logging.set_verbosity_error()
    dtype = parse_dtype(args.dtype)
    prompts = load_prompts(args.prompts_per_category)
    report = {
        "config": {**{k: str(v) for k, v in vars(args).items()}, "prompts": [asdict(p) for p in prompts],
                   "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "transformers": transformers.__version__, "warmup_tokens": WARMUP_TOKENS},
    }
    print(f"# foretell core speed: {len(prompts)} Spec-Bench prompts, {args.dtype}, greedy, "
          f"{args.max_new_tokens} new tokens, {torch.get_num_threads()} threads\n")
    parts = [("qwen", "Part A: Qwen2.5-Coder-1.5B (target) + 0.5B (draft)", part_a, args.skip_qwen),
             ("smollm", "Part B: SmolLM2-135M", part_b, args.skip_smollm)]
    for key, title, fn, skip in parts:
        if skip:
            continue
        totals, speedups = fn(args, dtype, prompts)
        print(f"## {title}\n\n{markdown(totals, speedups, len(prompts))}\n", flush=True)
        report[key] = to_json(totals, speedups)
        del totals
        gc.collect()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"results: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
