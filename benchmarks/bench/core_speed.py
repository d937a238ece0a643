"""Core speed benchmark: foretell vs transformers on CPU, greedy, Spec-Bench prompts.

Part A (Qwen2.5-Coder 1.5B target, 0.5B draft): foretell plain and draft-model decoding,
transformers plain `generate` and assisted generation. Part B (SmolLM2-135M): foretell plain
and prompt-lookup decoding, transformers plain `generate`. Every method gets the same
chat-templated token ids; methods are interleaved per prompt so machine noise hits all alike.

"tok/s" counts the whole call (prefill included); "decode tok/s" leaves out the time to the
first streamed tokens (prefill + first step) and those tokens.

    python benchmarks/bench/core_speed.py > benchmarks/results/core_speed.md
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Callable

import torch
import transformers
from tqdm import tqdm
from transformers import AutoModelForCausalLM

import foretell
from foretell.bench.datasets import spec_bench_path
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.runtime.loading import parse_dtype, resolve_model_dir
from foretell.types import GenerationStats, SamplingParams

SPEC_BENCH = spec_bench_path()  # ../shared/data, or $FORETELL_DATA
OWN_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")  # the rest is MT-Bench
QWEN_TARGET, QWEN_DRAFT, SMOLLM = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"
WARMUP_TOKENS = 16


@dataclass
class Prompt:
    question_id: int
    category: str
    text: str


@dataclass
class Run:
    """One generation: its new tokens, when the first of them arrived, and foretell's stats."""

    tokens: list[int]
    first_seconds: float
    first_tokens: int
    stats: GenerationStats | None = None  # foretell methods only


Runner = Callable[[list[int], int], Run]  # (prompt ids, max new tokens) -> Run


@dataclass
class MethodTotals:
    """One method's results summed over all prompts."""

    name: str
    reference: str | None = None  # the method whose greedy outputs this one's are compared with
    new_tokens: int = 0
    seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    target_passes: int = 0
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    same_as_reference: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    per_prompt: list[dict] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def mean_tau(self) -> float | None:
        """Tokens per target pass, pooled over prompts."""
        if not self.proposed_per_position:  # not a speculative method
            return None
        return (sum(self.accepted_per_position) + self.target_passes) / self.target_passes

    def add(self, run: Run, seconds: float, prompt: Prompt, prompt_tokens: int) -> None:
        self.new_tokens += len(run.tokens)
        self.seconds += seconds
        self.decode_tokens += len(run.tokens) - run.first_tokens
        self.decode_seconds += seconds - run.first_seconds
        self.outputs.append(run.tokens)
        if run.stats is not None:
            self.target_passes += run.stats.target_passes
            self.proposed_per_position = add_lists(self.proposed_per_position, run.stats.proposed_per_position)
            self.accepted_per_position = add_lists(self.accepted_per_position, run.stats.accepted_per_position)
        self.per_prompt.append({
            "question_id": prompt.question_id, "category": prompt.category, "prompt_tokens": prompt_tokens,
            "new_tokens": len(run.tokens), "seconds": round(seconds, 3), "first_seconds": round(run.first_seconds, 3),
        } | ({"foretell_stats": run.stats.to_dict()} if run.stats else {}))


def add_lists(a: list[int], b: list[int]) -> list[int]:
    return [x + y for x, y in zip_longest(a, b, fillvalue=0)]


def load_prompts(per_category: int) -> list[Prompt]:
    """The first `per_category` prompts of each of Spec-Bench's six categories, in file order."""
    by_category: dict[str, list[Prompt]] = {}
    for line in SPEC_BENCH.read_text().splitlines():
        q = json.loads(line)
        category = q["category"] if q["category"] in OWN_CATEGORIES else "mt_bench"
        bucket = by_category.setdefault(category, [])
        if len(bucket) < per_category:
            bucket.append(Prompt(q["question_id"], category, q["turns"][0]))
    return [p for bucket in by_category.values() for p in bucket]


def foretell_runner(pipeline: foretell.Pipeline) -> Runner:
    def run(ids: list[int], max_new: int) -> Run:
        t0, first = time.perf_counter(), None
        for chunk in pipeline.engine.stream(ids, SamplingParams(max_new_tokens=max_new)):
            first = first or (time.perf_counter() - t0, len(chunk.tokens))
            result = chunk.result
        return Run(result.tokens, *first, result.stats)

    return run


class FirstTokenTimer:
    """A transformers streamer that notes when the first new tokens arrive (its first put is the prompt)."""

    def __init__(self):
        self.t0, self.calls, self.first = time.perf_counter(), 0, (0.0, 0)

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = (time.perf_counter() - self.t0, value.numel())

    def end(self) -> None:
        pass


def hf_runner(model, stop_ids: set[int], **extra) -> Runner:
    def run(ids: list[int], max_new: int) -> Run:
        timer, input_ids = FirstTokenTimer(), torch.tensor([ids])
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new,
            eos_token_id=sorted(stop_ids), pad_token_id=min(stop_ids), streamer=timer, **extra,
        )
        new = out[0, len(ids):].tolist()
        while new and new[-1] in stop_ids:  # foretell does not return the stop token
            new.pop()
        return Run(new, *timer.first)

    return run


def load_hf(preset: str, dtype: torch.dtype):
    return AutoModelForCausalLM.from_pretrained(resolve_model_dir(preset), dtype=dtype).eval()


def run_part(title: str, methods: dict[str, tuple[Runner, str | None]], prompts: list[Prompt],
             ids: list[list[int]], max_new: int) -> tuple[dict[str, MethodTotals], float]:
    """Warm each method up once, then run all methods on prompt 1, then on prompt 2, ...

    Also returns the CPU cores this process got on average while timed (= threads: no contention).
    """
    totals = {name: MethodTotals(name, reference) for name, (_, reference) in methods.items()}
    with torch.inference_mode():
        for runner, _ in tqdm(methods.values(), desc=f"{title} warm-up", file=sys.stderr):
            runner(ids[0], min(WARMUP_TOKENS, max_new))
        wall, cpu = time.perf_counter(), time.process_time()
        with tqdm(total=len(prompts) * len(methods), desc=title, file=sys.stderr) as bar:
            for prompt, prompt_ids in zip(prompts, ids):
                for name, (runner, _) in methods.items():
                    t0 = time.perf_counter()
                    run = runner(prompt_ids, max_new)
                    totals[name].add(run, time.perf_counter() - t0, prompt, len(prompt_ids))
                    bar.update()
        cores = (time.process_time() - cpu) / (time.perf_counter() - wall)
    for t in totals.values():
        if t.reference:
            t.same_as_reference = sum(a == b for a, b in zip(t.outputs, totals[t.reference].outputs))
    return totals, cores


def part_a(args, dtype: torch.dtype, prompts: list[Prompt]):
    # The draft with int8 weights (lossless: the target still verifies every token); with
    # --bf16-draft also the same draft in bf16, sharing the target's weights.
    pipe = foretell.load(QWEN_TARGET, draft=QWEN_DRAFT, drafter="draft-model", dtype=dtype, gamma=args.gamma,
                         draft_quant="int8", hot_vocab=args.hot_vocab)
    hf_target, hf_draft = load_hf(QWEN_TARGET, dtype), load_hf(QWEN_DRAFT, dtype)
    stop = pipe.engine.stop_ids
    hot = f", hot vocab {args.hot_vocab}" if args.hot_vocab else ""
    plain, draft = "foretell plain 1.5B", f"foretell draft 0.5B int8{hot}, gamma {args.gamma}"
    hf_plain, hf_assisted = "transformers plain 1.5B", "transformers assisted 0.5B"
    methods = {
        plain: (foretell_runner(pipe.with_drafter(None)), None),
        draft: (foretell_runner(pipe), plain),
        hf_plain: (hf_runner(hf_target, stop), plain),
        hf_assisted: (hf_runner(hf_target, stop, assistant_model=hf_draft), hf_plain),
    }
    pairs = [(draft, plain), (hf_assisted, hf_plain), (plain, hf_plain), (draft, hf_assisted)]
    if args.bf16_draft:
        bf16 = foretell.load(QWEN_DRAFT, drafter="none", dtype=dtype).target.model
        bf16_draft = f"foretell draft 0.5B bf16, gamma {args.gamma}"
        drafter = DraftModelDrafter(bf16, pipe.target.config.vocab_size)
        methods[bf16_draft] = (foretell_runner(pipe.with_drafter(drafter, gamma=args.gamma)), plain)
        pairs += [(bf16_draft, plain), (bf16_draft, hf_assisted)]
    names = list(methods)
    ids = [pipe.encode(p.text, chat=True) for p in prompts]
    index_pairs = [(names.index(a), names.index(b)) for a, b in pairs]
    return *run_part("Qwen", methods, prompts, ids, args.max_new_tokens), index_pairs, names


def part_b(args, dtype: torch.dtype, prompts: list[Prompt]):
    pipe = foretell.load(SMOLLM, drafter="none", dtype=dtype)
    n = ["foretell plain SmolLM2", f"foretell prompt-lookup SmolLM2, gamma {args.gamma}", "transformers plain SmolLM2"]
    methods = {
        n[0]: (foretell_runner(pipe), None),
        n[1]: (foretell_runner(pipe.with_drafter(PromptLookupDrafter(), gamma=args.gamma)), n[0]),
        n[2]: (hf_runner(load_hf(SMOLLM, dtype), pipe.engine.stop_ids), n[0]),
    }
    ids = [pipe.encode(p.text, chat=True) for p in prompts]
    return *run_part("SmolLM2", methods, prompts, ids, args.max_new_tokens), [(1, 0), (0, 2)], n


def speedups(totals: dict[str, MethodTotals], pairs: list[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    """'a vs b' -> (ratio of tok/s, ratio of decode tok/s)."""
    a_b = {f"{a} vs {b}": (totals[a], totals[b]) for a, b in pairs}
    return {k: (a.tokens_per_second / b.tokens_per_second,
                a.decode_tokens_per_second / b.decode_tokens_per_second) for k, (a, b) in a_b.items()}


def markdown(totals: dict[str, MethodTotals], ratios: dict[str, tuple[float, float]], n_prompts: int) -> str:
    lines = ["| method | new tokens | seconds | tok/s | decode tok/s | mean tau | same output as |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for t in totals.values():
        tau = f"{t.mean_tau:.2f}" if t.mean_tau is not None else "-"
        same = f"{t.reference}: {t.same_as_reference}/{n_prompts}" if t.reference else "-"
        lines.append(f"| {t.name} | {t.new_tokens} | {t.seconds:.1f} | {t.tokens_per_second:.2f} "
                     f"| {t.decode_tokens_per_second:.2f} | {tau} | {same} |")
    lines += ["", "| speedup | tok/s | decode tok/s |", "|---|---:|---:|"]
    lines += [f"| {k} | {r:.2f}x | {d:.2f}x |" for k, (r, d) in ratios.items()]
    return "\n".join(lines)


def to_json(totals: dict[str, MethodTotals], ratios: dict[str, tuple[float, float]], cores: float) -> dict:
    methods = {}
    for t in totals.values():
        methods[t.name] = {k: v for k, v in asdict(t).items() if k != "outputs"} | {
            "tokens_per_second": round(t.tokens_per_second, 3),
            "decode_tokens_per_second": round(t.decode_tokens_per_second, 3),
            "mean_tau": t.mean_tau and round(t.mean_tau, 3),
            "acceptance_per_position": [round(a / p, 3) for a, p in zip(t.accepted_per_position, t.proposed_per_position)],
        }
    ratios = {k: {"tok_s": round(r, 3), "decode_tok_s": round(d, 3)} for k, (r, d) in ratios.items()}
    return {"methods": methods, "speedups": ratios, "cpu_cores_used": round(cores, 3)}


def source_version() -> str:
    """The git commit benchmarked, marked dirty when src/ has uncommitted changes."""
    git = ["git", "-C", str(Path(__file__).resolve().parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "../../src"], capture_output=True, text=True).stdout
    return head + ("+dirty" if dirty.strip() else "")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts-per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=4,
                   help="draft length (fixed policy) for the 0.5B draft and prompt lookup (default: %(default)s)")
    p.add_argument("--hot-vocab", type=int, default=32768,
                   help="hot vocabulary size for the int8 draft (0 = the full vocabulary; default: %(default)s)")
    p.add_argument("--bf16-draft", action="store_true", help="also time the draft with bf16 weights (no int8, full vocabulary)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--skip-qwen", action="store_true", help="skip part A (Qwen2.5-Coder 1.5B + 0.5B)")
    p.add_argument("--skip-smollm", action="store_true", help="skip part B (SmolLM2-135M)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/core_speed.json"))
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(2)
    transformers.logging.set_verbosity_error()
    prompts = load_prompts(args.prompts_per_category)
    report = {"config": {k: str(v) for k, v in vars(args).items()} | {
        "source": source_version(), "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "warmup_tokens": WARMUP_TOKENS, "prompts": [asdict(p) for p in prompts]}}
    print(f"# foretell core speed: {len(prompts)} Spec-Bench prompts, {args.dtype}, greedy, "
          f"{args.max_new_tokens} new tokens, {torch.get_num_threads()} threads, "
          f"foretell {report['config']['source']}\n")
    parts = [("qwen", "Part A: Qwen2.5-Coder-1.5B target, 0.5B draft", part_a, args.skip_qwen),
             ("smollm", "Part B: SmolLM2-135M", part_b, args.skip_smollm)]
    for key, title, part, skip in parts:
        if skip:
            continue
        totals, cores, pairs, names = part(args, parse_dtype(args.dtype), prompts)
        ratios = speedups(totals, [(names[a], names[b]) for a, b in pairs])
        print(f"## {title}\n\n{markdown(totals, ratios, len(prompts))}\n\n"
              f"CPU cores this process got while timed: {cores:.2f} of {torch.get_num_threads()}\n", flush=True)
        report[key] = to_json(totals, ratios, cores)
        del totals
        gc.collect()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"results: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
