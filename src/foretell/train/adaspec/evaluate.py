"""How good a draft is: the token acceptance rate alpha, and real speculative decoding with it.

alpha = mean over positions of sum_v min(p(v), q(v)), with p the target's and q the draft's
next-token distribution on held-out text (teacher-forced). It is the probability that lossless
speculative sampling accepts a draft token there (Leviathan et al.), and the metric AdaSPEC reports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from foretell.api import load
from foretell.bench.datasets import load_prompts
from foretell.build import check_same_tokenizer
from foretell.config import SpeculativeConfig
from foretell.conversations import conversations
from foretell.models.transformer import Transformer
from foretell.runtime.loading import build_model, load_tokenizer, parse_dtype, resolve_model_dir
from foretell.train.common.data import DataConfig, TokenData, build_token_data


def acceptance_per_token(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """sum_v min(p, q) [...] for logits [..., V] at a sampling temperature."""
    p = torch.softmax(p_logits.float() / temperature, dim=-1)
    q = torch.softmax(q_logits.float() / temperature, dim=-1)
    return torch.minimum(p, q).sum(-1)


@torch.no_grad()
def teacher_forced_logits(target: Transformer, drafts: dict[str, Transformer], data: TokenData, batch_size: int = 4,
                          desc: str = "alpha"):
    """Per batch of `data`: (target logits, {name: draft logits}, trained-position mask), all on the CPU;
    the target runs once per batch."""
    for start in tqdm(range(0, len(data), batch_size), desc=desc, unit="batch"):
        ids = data.input_ids[start : start + batch_size]
        p_logits = target.forward_sequences(ids.to(target.device)).logits.cpu()
        q_logits = {name: draft.forward_sequences(ids.to(draft.device)).logits.cpu() for name, draft in drafts.items()}
        yield p_logits, q_logits, data.loss_mask[start : start + batch_size]


def token_acceptance(target: Transformer, drafts: dict[str, Transformer], data: TokenData, batch_size: int = 4,
                     temperature: float = 1.0) -> dict[str, float]:
    """alpha of each draft over the trained (assistant) positions of `data`."""
    sums = dict.fromkeys(drafts, 0.0)
    count = 0
    for p_logits, q_logits, mask in teacher_forced_logits(target, drafts, data, batch_size):
        count += int(mask.sum())
        for name, q in q_logits.items():
            sums[name] += float(acceptance_per_token(p_logits, q, temperature)[mask].sum())
    return {name: s / max(count, 1) for name, s in sums.items()}


def eval_prompts(source: str, count: int) -> list[list[dict]]:
    """The first `count` held-out conversations, cut before their first answer; for
    "spec-bench", first turns spread over its categories (ceil(count / 6) per category)."""
    if source == "spec-bench":
        per_category = -(-count // 6)
        rows = load_prompts(["spec-bench"], per_category)
        return [[{"role": "user", "content": r["prompt"]}] for r in rows][:count]
    prompts = []
    for messages in conversations(source, "test"):
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first:
            prompts.append(messages[:first])
        if len(prompts) == count:
            break
    return prompts


@dataclass
class DecodeStats:
    tokens: int = 0
    seconds: float = 0.0
    target_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    first_proposed: int = 0  # first draft position only: its acceptance estimates alpha directly
    first_accepted: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def add(self, stats) -> None:
        self.tokens += stats.new_tokens
        self.seconds += stats.total_seconds
        self.target_passes += stats.target_passes
        self.proposed += sum(stats.proposed_per_position)
        self.accepted += sum(stats.accepted_per_position)
        self.first_proposed += stats.proposed_per_position[0] if stats.proposed_per_position else 0
        self.first_accepted += stats.accepted_per_position[0] if stats.accepted_per_position else 0


@dataclass
class SpeculativeResult:
    acceptance_rate: float  # accepted / proposed draft tokens (later positions only count after a pass)
    first_acceptance: float  # accepted / proposed at the first draft position: the empirical alpha
    tau: float  # tokens per target pass
    plain_tokens_per_s: float
    spec_tokens_per_s: float

    @property
    def speedup(self) -> float:
        return self.spec_tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else 0.0

    def to_dict(self) -> dict:
        return {**{k: round(v, 4) for k, v in asdict(self).items()}, "speedup": round(self.speedup, 4)}


def speculative_decoding(target: str | Path, drafts: dict[str, Path], prompts: list[list[dict]], gamma: int,
                         max_new_tokens: int, temperature: float, seed: int, dtype: str) -> dict[str, SpeculativeResult]:
    """Decode every prompt plainly, then with each draft (same seed), interleaved so that a change
    in machine load hits every method alike; statistics are summed over the prompts."""
    pipe = load(target, "none", dtype=dtype)
    pipes = {name: pipe.with_speculative(SpeculativeConfig(method="draft-model", model=str(path), gamma=gamma,
                                                           draft_quant="none"))
             for name, path in drafts.items()}
    plain, spec = DecodeStats(), {name: DecodeStats() for name in drafts}
    sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed}
    for messages in tqdm(prompts, desc="speculative decoding", unit="prompt"):
        plain.add(pipe.generate(messages, **sampling).stats)
        for name, draft_pipe in pipes.items():
            spec[name].add(draft_pipe.generate(messages, **sampling).stats)
    return {name: SpeculativeResult(
        acceptance_rate=s.accepted / s.proposed if s.proposed else 0.0,
        first_acceptance=s.first_accepted / s.first_proposed if s.first_proposed else 0.0,
        tau=(s.accepted + s.target_passes) / s.target_passes if s.target_passes else 0.0,
        plain_tokens_per_s=plain.tokens_per_second,
        spec_tokens_per_s=s.tokens_per_second,
    ) for name, s in spec.items()}


@dataclass(frozen=True)
class EvalOptions:
    num_sequences: int = 64  # held-out sequences for alpha
    seq_len: int = 256
    prompts: int = 4  # held-out prompts decoded for real (0 = alpha only)
    max_new_tokens: int = 64
    gamma: int = 4
    temperature: float = 1.0  # alpha's temperature too; at 1.0 the empirical acceptance estimates alpha
    seed: int = 0
    dtype: str = "float32"
    batch_size: int = 4
    prompt_source: str | None = None  # where the decoded prompts come from (None: the held-out data; or spec-bench)
    decode_temperature: float | None = None  # the real decoding's (0: greedy); None: `temperature`


def compare_drafts(target: str | Path, drafts: dict[str, Path], source: str, opts: EvalOptions) -> list[dict]:
    """One row per draft: alpha on held-out data, then (if opts.prompts) real speculative decoding."""
    target_dir = resolve_model_dir(target)
    tokenizer = load_tokenizer(target_dir)
    draft_dirs = {name: resolve_model_dir(path) for name, path in drafts.items()}
    for folder in draft_dirs.values():
        check_same_tokenizer(tokenizer, load_tokenizer(folder), str(target), str(folder))
    data = build_token_data(DataConfig(source, "test", opts.num_sequences, opts.seq_len), tokenizer)
    dtype = parse_dtype(opts.dtype)
    models = {name: build_model(folder, dtype) for name, folder in draft_dirs.items()}
    alphas = token_acceptance(build_model(target_dir, dtype), models, data, opts.batch_size, opts.temperature)
    del models
    rows = [{"draft": name, "path": str(draft_dirs[name]), "alpha": round(alphas[name], 4)} for name in drafts]
    if opts.prompts:
        prompts = eval_prompts(opts.prompt_source or source, opts.prompts)
        temperature = opts.temperature if opts.decode_temperature is None else opts.decode_temperature
        results = speculative_decoding(target_dir, draft_dirs, prompts, opts.gamma,
                                       opts.max_new_tokens, temperature, opts.seed, opts.dtype)
        for row in rows:
            row.update(results[row["draft"]].to_dict())
    return rows


def format_table(rows: list[dict], cols: list[str] | None = None) -> str:
    """A markdown table of `rows`; cols default to the draft-comparison columns present."""
    if cols is None:
        cols = [c for c in ("draft", "alpha", "first_acceptance", "acceptance_rate", "tau", "speedup",
                            "spec_tokens_per_s", "plain_tokens_per_s") if any(c in r for r in rows)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)
