"""Self-distillation data: the target's own answers to a data set's prompts.

A drafter is judged on text the target writes, not on the data set's reference answers, and for
a small target the two differ a lot (SmolLM2-135M rarely writes GSM8K's reference solution). So
drafters train best on the target's responses: keep each conversation's first user turn, let
the target answer it, and write {"messages": [user, assistant]} rows that `--data FILE` reads.

Generation is batched (rows decoded side by side, prompts left-padded) because one sequence at a
time would take hours on a CPU. Rows are appended as they finish, so an interrupted run resumes
where it stopped: rerunning the same command skips the prompts already answered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from foretell.errors import ForetellError
from foretell.kv_cache import KVCache
from foretell.models.transformer import Transformer


@dataclass(frozen=True)
class SelfDataConfig:
    target: str = "smollm2-135m"
    source: str = "gsm8k"  # gsm8k | sharegpt | both | a .jsonl file (the prompts' origin)
    split: str = "train"  # test: held-out prompts, to evaluate drafters on the target's own text
    num_prompts: int = 2000
    max_prompt_tokens: int = 384  # longer first turns are skipped (the drafter trains on seq_len windows)
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy, the target's deterministic answer
    batch_size: int = 32
    dtype: str = "bfloat16"
    seed: int = 0

    def __post_init__(self):
        for name in ("num_prompts", "max_prompt_tokens", "max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ForetellError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ForetellError(f"--temperature must be >= 0, got {self.temperature}")


@torch.no_grad()
def generate_batch(model: Transformer, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int],
                   temperature: float = 0.0, generator: torch.Generator | None = None) -> list[list[int]]:
    """Each prompt's continuation (up to and including a stop token), decoded side by side.

    Prompts are left-padded: a row's positions count its own tokens only, and no query attends
    to a pad key (a pad query attends to itself, so its row stays finite and is never read).
    """
    B, device = len(prompts), model.device
    L = max(len(p) for p in prompts)
    ids = torch.zeros(B, L, dtype=torch.long, device=device)
    real = torch.zeros(B, L + max_new_tokens, dtype=torch.bool, device=device)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p, device=device)
        real[b, L - len(p):] = True
    c = model.config
    cache = KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, L + max_new_tokens, model.dtype, device, B)
    positions = (real[:, :L].long().cumsum(1) - 1).clamp(min=0)
    causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    mask = (causal[None] & real[:, None, :L]) | torch.eye(L, dtype=torch.bool, device=device)[None]
    logits = _forward(model, ids, positions, cache, mask[:, None])[:, -1]
    out: list[list[int]] = [[] for _ in range(B)]
    rows = torch.arange(B, device=device)  # which prompt each live batch row decodes
    next_pos = positions[:, -1] + 1
    for step in range(max_new_tokens):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            token = logits.argmax(-1)
        live = torch.ones(len(rows), dtype=torch.bool, device=device)
        for i, (b, t) in enumerate(zip(rows.tolist(), token.tolist())):
            out[b].append(t)
            if t in stop_ids:
                live[i] = False
        if not bool(live.any()) or step + 1 == max_new_tokens:
            break
        if not bool(live.all()):  # drop finished rows: a batch costs what its live rows need
            keep = torch.nonzero(live).flatten()
            rows, token, next_pos, real = rows[keep], token[keep], next_pos[keep], real[keep]
            cache.k, cache.v = cache.k[:, keep], cache.v[:, keep]
        visible = real[:, : L + step + 1][:, None, None]  # [B, 1, 1, S]: the new token sees every real key
        logits = _forward(model, token[:, None], next_pos[:, None], cache, visible)[:, -1]
        next_pos = next_pos + 1
    return out


def _forward(model: Transformer, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
             mask: torch.Tensor) -> torch.Tensor:
    """[B, T] new tokens at per-row positions after the cache's prefix -> [B, T, V] float logits."""
    logits = model.forward_batch(ids, positions, cache, mask)
    cache.commit_prefix(ids.shape[1])
    return logits


def first_turns(source: str, tokenizer, max_prompt_tokens: int, limit: int,
                split: str = "train") -> list[tuple[list[dict], list[int]]]:
    """Up to `limit` one-message conversations (the first user turn) that fit max_prompt_tokens, with their ids."""
    from foretell.text import encode_prompt
    from foretell.train.common.data import conversations

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


def make_self_data(cfg: SelfDataConfig, out: Path) -> Path:
    """Write (or finish writing) `out`: one {"messages": [user, assistant]} row per prompt, in prompt order."""
    from foretell.models.loading import load_model
    from foretell.models.wide_linear import widen_linears
    from foretell.sampling import make_generator
    from foretell.text import stop_token_ids

    loaded = load_model(cfg.target, cfg.dtype)
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    # bf16 without a native bf16 matmul (AVX2): the batch's passes in fp32, several times faster than emulated bf16
    widen_linears(model)
    prompts = first_turns(cfg.source, tokenizer, cfg.max_prompt_tokens, cfg.num_prompts, cfg.split)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = done_count(out)
    stop_ids = stop_token_ids(tokenizer, loaded.config.eos_token_ids)
    bar = tqdm(total=len(prompts), initial=start, desc="target answers", unit="prompt")
    # Longest prompts first within a batch window would pad less, but the file order must stay
    # the prompt order for resuming, so batches are consecutive prompts.
    for first in range(start, len(prompts), cfg.batch_size):
        batch = prompts[first : first + cfg.batch_size]
        generator = make_generator(cfg.seed + first) if cfg.temperature > 0 else None
        answers = generate_batch(model, [ids for _, ids in batch], cfg.max_new_tokens, stop_ids, cfg.temperature, generator)
        with open(out, "a", encoding="utf-8") as f:
            for (p, _), answer in zip(batch, answers):
                text = tokenizer.decode([t for t in answer if t not in stop_ids], skip_special_tokens=True)
                f.write(json.dumps({"messages": [*p, {"role": "assistant", "content": text}]}) + "\n")
        bar.update(len(batch))
    bar.close()
    return out


def add_self_data_parser(sub) -> None:
    d = SelfDataConfig()
    p = sub.add_parser(
        "self-data", help="write the target's own answers to a data set's prompts (drafter training data)",
        description="Takes the first user turn of each conversation of a data set, lets the target "
        "answer it (batched decoding) and writes {\"messages\": [user, assistant]} rows to OUT, which "
        "`foretell train KIND --data OUT` reads. Drafters judged on the target's own "
        "text train best on it. Rerunning the same command continues an interrupted file.",
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
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts decoded side by side (default: %(default)s)")
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16"), help="target dtype (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed when --temperature > 0 (default: %(default)s)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", required=True, help="the .jsonl file to write (or finish)")


def cmd_self_data(args) -> None:
    if args.threads is not None:
        if args.threads < 1:
            raise ForetellError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    cfg = SelfDataConfig(args.target, args.data, args.split, args.num_prompts, args.max_prompt_tokens, args.max_new_tokens,
                         args.temperature, args.batch_size, args.dtype, args.seed)
    print(f"answers: {make_self_data(cfg, Path(args.out))}")
