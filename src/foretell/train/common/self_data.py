"""Self-distillation data: the target's own answers to a data set's prompts.

A drafter is judged on text the target writes, not on the data set's reference answers, and for
a small target the two differ a lot (SmolLM2-135M rarely writes GSM8K's reference solution). So
drafters train best on the target's responses: keep each conversation's first user turn, let
the target answer it, and write {"messages": [user, assistant]} rows that `--data FILE` reads.

The answers come from foretell's own engine, the one `foretell generate` and the server decode with: continuous
batching (batching.py), each request drafted by the target's default drafter (or `--drafter`), lossless, so every
answer is exactly what the target writes alone (greedy: its plain decoding). One sequence at a time would take
hours on a CPU; drafting doubles the answers a second there. Rows are written in prompt order as they finish, so
an interrupted run resumes where it stopped: rerunning the same command skips the prompts already answered.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm
import torch

from foretell.api import load
from foretell.build import default_speculative
from foretell.config import SpeculativeConfig
from foretell.conversations import conversations
from foretell.errors import ForetellError
from foretell.spec_args import add_speculative_args, speculative_from_args
from foretell.text import encode_prompt
from foretell.types import SamplingParams


@dataclass(frozen=True)
class SelfDataConfig:
    target: str = "smollm2-135m"
    source: str = "gsm8k"  # gsm8k | sharegpt | both | a .jsonl file (the prompts' origin)
    split: str = "train"  # test: held-out prompts, to evaluate drafters on the target's own text
    num_prompts: int = 2000
    max_prompt_tokens: int = 384  # longer first turns are skipped (the drafter trains on seq_len windows)
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy, the target's deterministic answer
    batch_size: int = 16  # requests decoded together (continuous batching)
    dtype: str = "bfloat16"
    seed: int = 0  # with temperature > 0: prompt i samples with seed + i, whatever the batch
    speculative: SpeculativeConfig | None = None  # the drafter (lossless); None: the target's default

    def __post_init__(self):
        for name in ("num_prompts", "max_prompt_tokens", "max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ForetellError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ForetellError(f"--temperature must be >= 0, got {self.temperature}")
        if self.speculative is not None and self.speculative.lossy:
            raise ForetellError("self-data writes the target's own answers, which LOSSY verification would change: "
                                "leave --lossy-threshold off")


def first_turns(source: str, tokenizer, max_prompt_tokens: int, limit: int,
                split: str = "train") -> list[tuple[list[dict], list[int]]]:
    """Up to `limit` one-message conversations (the first user turn) that fit max_prompt_tokens, with their ids."""
    sources = ("gsm8k", "sharegpt") if source == "both" else (source,)
    per_source = [limit - limit // 2, limit // 2] if source == "both" else [limit]
    chosen: list[tuple[list[dict], list[int]]] = []
    for name, want in zip(sources, per_source):
        taken = 0
        for messages in conversations(name, split):
            if taken >= want:
                break
            user = messages[0]
            if user["role"] != "user":
                continue
            prompt = [user]
            ids = encode_prompt(tokenizer, prompt, chat=True)
            if len(ids) <= max_prompt_tokens:
                chosen.append((prompt, ids))
                taken += 1
    if not chosen:
        raise ForetellError(f"no prompts from {source!r} fit --max-prompt-tokens {max_prompt_tokens}")
    return chosen


def done_count(out: Path) -> int:
    """Rows already written (a partly written last line, from a kill mid-write, is dropped)."""
    if not out.is_file():
        return 0
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    good = [ln for ln in lines if ln.endswith("\n")]
    if len(good) != len(lines):
        out.write_text("".join(good), encoding="utf-8")
    return len(good)


def make_self_data(cfg: SelfDataConfig, out: Path, why: str = "") -> Path:
    """Write (or finish writing) `out`: one {"messages": [user, assistant]} row per prompt, in prompt order.
    why: how the drafter was chosen, for the log line."""
    spec, why = (cfg.speculative, why) if cfg.speculative is not None else default_speculative(cfg.target)
    pipe = load(cfg.target, spec, dtype=cfg.dtype)
    print(f"[drafter: {spec.describe()}{': ' + why if why else ''}; lossless, so the answers are the target's own]",
          file=sys.stderr)
    prompts = first_turns(cfg.source, pipe.tokenizer, cfg.max_prompt_tokens, cfg.num_prompts, cfg.split)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = done_count(out)
    batch = pipe.batch_engine(max_batch=cfg.batch_size)
    answers: dict[int, list[int]] = {}
    failures: list[Exception] = []

    def keep(i: int):
        def on_chunk(chunk) -> None:
            if chunk.result is not None:
                answers[i] = chunk.result.tokens  # without the stop token
        return on_chunk

    for i in range(start, len(prompts)):
        params = SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                seed=cfg.seed + i if cfg.temperature > 0 else None)
        batch.submit(prompts[i][1], params, keep(i), failures.append)
    bar = tqdm(total=len(prompts), initial=start, desc="target answers", unit="prompt")
    written = start
    while not batch.idle:
        batch.step()
        if failures:
            raise failures[0]
        if written not in answers:
            continue
        with open(out, "a", encoding="utf-8") as f:  # the finished prefix, so the file stays in prompt order
            while written in answers:
                text = pipe.tokenizer.decode(answers.pop(written), skip_special_tokens=True)
                f.write(json.dumps({"messages": [*prompts[written][0], {"role": "assistant", "content": text}]}) + "\n")
                written += 1
                bar.update(1)
    bar.close()
    return out


def add_self_data_parser(sub) -> None:
    d = SelfDataConfig()
    p = sub.add_parser(
        "self-data", help="write the target's own answers to a data set's prompts (drafter training data)",
        description="Takes the first user turn of each conversation of a data set, lets the target answer it "
        "(foretell's engine: continuous batching, drafted losslessly by the target's default drafter or --drafter) and "
        "writes {\"messages\": [user, assistant]} rows to OUT, which `foretell train KIND --data OUT` reads. Drafters "
        "judged on the target's own text train best on it. Rerunning the same command continues an interrupted file.",
    )
    p.add_argument("--target", default=d.target, help="target model: preset, .gguf or HF folder (default: %(default)s)")
    p.add_argument("--data", default=d.source, help="prompts: gsm8k | sharegpt | both (half each) | a .jsonl file (default: %(default)s)")
    p.add_argument("--split", default=d.split, choices=("train", "test"),
                   help="the data set's split the prompts come from (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=d.num_prompts, help="prompts to answer (default: %(default)s)")
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens,
                   help="skip prompts longer than this (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="answer length cap (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="0 = greedy (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="requests decoded together, continuous batching (default: %(default)s)")
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16"), help="target dtype (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed when --temperature > 0 (default: %(default)s)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", required=True, help="the .jsonl file to write (or finish)")
    add_speculative_args(p)  # the drafter that speeds the answers up (lossless): the target's default without flags


def cmd_self_data(args) -> None:
    if args.threads is not None:
        if args.threads < 1:
            raise ForetellError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    spec, why = speculative_from_args(args, args.target)
    if args.save_spec_config:
        print(f"[speculative config written to {spec.save(args.save_spec_config)}]", file=sys.stderr)
    cfg = SelfDataConfig(args.target, args.data, args.split, args.num_prompts, args.max_prompt_tokens, args.max_new_tokens,
                         args.temperature, args.batch_size, args.dtype, args.seed, spec)
    print(f"answers: {make_self_data(cfg, Path(args.out), why)}")

