"""Typed hand-offs between the engine, drafters and verifiers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from foretell.errors import ForetellError
from foretell.tree import depths


SAMPLING_RULES = ("coupled", "rejection", None)
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # How a sampled token is chosen (sampling.py): "coupled", Gumbel-max with noise keyed by the seed and the output
    # position, so the output depends on the seed alone, not on drafts, batch or timing; or "rejection", speculative
    # sampling's accept/resample test drawing from one generator. None: coupled with a seed, else rejection.
    sampling: str | None = None
    # Logits processing (logits_process.py), applied to the target's logits at every position before choosing,
    # each position given its own prefix. Penalties as vLLM defines them: presence and frequency count the
    # generated tokens, repetition (HF's rule) the prompt's and the generated ones.
    presence_penalty: float = 0.0  # subtracted once from every token generated so far; 0 = off
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens; 0 = off
    repetition_penalty: float = 1.0  # > 0: a seen token's logit divided (if > 0) or multiplied by it; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit); a dict is accepted
    response_format: ResponseFormat | None = None  # constrained output (grammar.py); None = free text
    # What to report: each generated token's log-probability (and the top_logprobs most likely tokens'),
    # log-softmax of the processed logits (above) before temperature, top-k and top-p.
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ForetellError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ForetellError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ForetellError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ForetellError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise ForetellError("stop strings must be non-empty")
        if self.seed is not None and not (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                                          and SEED_MIN <= self.seed <= SEED_MAX):
            raise ForetellError(f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}], got {self.seed!r}")
        if self.sampling not in SAMPLING_RULES:
            raise ForetellError(f"sampling must be 'coupled' or 'rejection' (or None: coupled with a seed, else "
                                f"rejection), got {self.sampling!r}")
        self._check_processing()

    def _check_processing(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (_is_number(value) and -2.0 <= value <= 2.0):
                raise ForetellError(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
        if not (_is_number(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 10.0):
            raise ForetellError(f"repetition_penalty must be a number in (0, 10] (1 = off), got {self.repetition_penalty!r}")
        bias = self.logit_bias
        pairs = tuple(bias.items()) if isinstance(bias, dict) else tuple(tuple(p) for p in bias)
        for token, value in pairs:
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise ForetellError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not (_is_number(value) and -100.0 <= value <= 100.0):
                raise ForetellError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for token {token}")
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(v)) for t, v in pairs)))
        if not isinstance(self.logprobs, bool):
            raise ForetellError(f"logprobs must be true or false, got {self.logprobs!r}")
        if not isinstance(self.top_logprobs, int) or isinstance(self.top_logprobs, bool) or not 0 <= self.top_logprobs <= 20:
            raise ForetellError(f"top_logprobs must be an integer in [0, 20], got {self.top_logprobs!r}")
        if self.top_logprobs and not self.logprobs:
            raise ForetellError("top_logprobs needs logprobs on")
        if self.response_format is not None and not isinstance(self.response_format, ResponseFormat):
            raise ForetellError(f"response_format must be a ResponseFormat, got {type(self.response_format).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def coupled(self) -> bool:
        """Whether sampled tokens follow the coupled rule (greedy decoding is deterministic under either)."""
        return self.sampling == "coupled" or (self.sampling is None and self.seed is not None)

    @property
    def processes_logits(self) -> bool:
        """Whether the target's logits are changed before choosing (penalties, bias or a grammar)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.response_format is not None)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ResponseFormat:
    """Output constrained to JSON: any JSON object ("json_object"), or a JSON document valid under `schema`
    ("json_schema", the schema as a JSON string)."""

    type: str
    schema: str | None = None

    def __post_init__(self):
        if self.type not in ("json_object", "json_schema"):
            raise ForetellError(f"response_format type must be json_object or json_schema, got {self.type!r}")
        if (self.type == "json_schema") != (self.schema is not None):
            raise ForetellError("response_format: json_schema takes a schema, json_object none")


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability under the target, and the `top` most likely tokens at its position
    as (token id, log-probability), most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Proposal:
    """What a drafter proposes for one verification step: a chain or a tree of draft tokens.

    tokens: [N] long, the draft tokens (for a chain: the continuation, in order).
    parents: [N] long or None. None means a chain; otherwise parents[i] is the index of node
        i's parent, -1 for a child of the root (the last committed token); see tree.py.
    q: [N, V] float32, the draft distribution each node was sampled from (processed by the same
        temperature / top-k / top-p as the target; siblings share their parent's row), or None
        when the drafter chose deterministically (prompt lookup, greedy or top-k drafting):
        then the verifier treats each node as a point mass (the EAGLE rule for siblings).
    draft_prob: [N] float32 or None: the drafter's probability of each node's token given its
        parent (the distribution it ranked or sampled by; greedy drafting: its softmax). Only the
        opt-in lossy verification (lossy.py) reads it; None when the drafter does not provide it.
    """

    tokens: torch.Tensor
    q: torch.Tensor | None = None
    parents: torch.Tensor | None = None
    draft_prob: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    @property
    def depth(self) -> int:
        """Draft tokens on the longest root-to-leaf path (a chain: its length)."""
        if self.is_chain or not self.size:
            return self.size

        return int(depths(self.parents).max())


@dataclass
class Verification:
    """The verifier's verdict on a proposal.

    accepted: how many draft tokens were accepted: a prefix of a chain, or a root-to-node path
        of a tree (listed in `path`).
    next_token: the token the target supplies after them: the recovered token sampled from the
        residual at the first rejection, or the bonus token when the accepted path is a leaf.
    path: node indices of the accepted path (a tree), or None for a chain.
    waived: how many of the accepted tokens skipped the target's check (opt-in lossy mode; else 0).
    """

    accepted: int
    next_token: int
    path: list[int] | None = None
    waived: int = 0


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens copied from the prefix cache, not read again
    new_tokens: int = 0
    target_passes: int = 0  # verification / decoding forwards (prefill not counted)
    draft_tokens_verified: int = 0  # draft tokens (chain length or tree nodes) sent to the target
    cache_bytes: int = 0  # KV caches of the target and the drafter for this generation
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    finish_reason: str = ""
    # Monitoring (as JetSpec reports it): passes that verified >= 1 draft token, and those that accepted >= 1.
    draft_passes: int = 0
    passes_with_accepted: int = 0
    # Opt-in lossy verification (lossy.py): None = lossless. lossy_accepted counts the accepted
    # tokens whose target check was waived.
    lossy_threshold: float | None = None
    lossy_accepted: int = 0
    # Opt-in result cache (result_cache.py): steps it was consulted, steps it added a branch,
    # steps an added node was accepted, and the accepted tokens only its branch had proposed.
    cache_steps: int = 0
    cache_hits: int = 0
    cache_useful: int = 0
    cache_accepted_tokens: int = 0

    @property
    def tau(self) -> float:
        """Mean tokens per verification: accepted drafts + 1 target token (bonus or recovered)."""
        if not self.target_passes:
            return 0.0
        return (sum(self.accepted_per_position) + self.target_passes) / self.target_passes

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_per_position, self.proposed_per_position)]

    @property
    def acceptance_rate(self) -> float:
        proposed = sum(self.proposed_per_position)
        return sum(self.accepted_per_position) / proposed if proposed else 0.0

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def verification_pass_rate(self) -> float:
        """Share of target passes with drafts in which at least one draft token was accepted."""
        return self.passes_with_accepted / self.draft_passes if self.draft_passes else 0.0

    @property
    def accepted_per_verified(self) -> float:
        """The pass rate per draft token: accepted / verified (tree nodes off the path count as verified)."""
        return self.accepted_tokens / self.draft_tokens_verified if self.draft_tokens_verified else 0.0

    @property
    def wasted_share(self) -> float:
        """Draft tokens the target computed but did not accept, over all draft tokens verified."""
        return 1.0 - self.accepted_per_verified if self.draft_tokens_verified else 0.0

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hits / self.cache_steps if self.cache_steps else 0.0

    @property
    def cache_useful_rate(self) -> float:
        return self.cache_useful / self.cache_steps if self.cache_steps else 0.0

    @property
    def decode_seconds(self) -> float:
        return self.total_seconds - self.prefill_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    def record(self, proposed: int, accepted: int) -> None:
        while len(self.proposed_per_position) < proposed:
            self.proposed_per_position.append(0)
            self.accepted_per_position.append(0)
        for i in range(proposed):
            self.proposed_per_position[i] += 1
            if i < accepted:
                self.accepted_per_position[i] += 1

    def to_dict(self) -> dict:
        out = {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "target_passes": self.target_passes,
            "tau": round(self.tau, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_per_position": [round(a, 4) for a in self.acceptance_per_position],
            "tokens_per_second": round(self.tokens_per_second, 3),
            "mean_verified_drafts": round(self.draft_tokens_verified / self.target_passes, 3) if self.target_passes else 0.0,
            "cache_bytes": self.cache_bytes,
            "prefill_seconds": round(self.prefill_seconds, 4),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "total_seconds": round(self.total_seconds, 4),
            "finish_reason": self.finish_reason,
            "draft_passes": self.draft_passes,
            "verification_pass_rate": round(self.verification_pass_rate, 4),
            "accepted_per_verified": round(self.accepted_per_verified, 4),
            "wasted_share": round(self.wasted_share, 4),
            "lossy_threshold": self.lossy_threshold,
        }
        if self.lossy_threshold is not None:
            out["lossy_accepted"] = self.lossy_accepted
        if self.cache_steps:
            out.update(cache_steps=self.cache_steps, cache_hit_rate=round(self.cache_hit_rate, 4),
                       cache_useful_rate=round(self.cache_useful_rate, 4), cache_accepted_tokens=self.cache_accepted_tokens)
        return out

    def summary(self) -> str:
        acc = " ".join(f"{a:.2f}" for a in self.acceptance_per_position)
        lossy = (
            f"LOSSY (threshold {self.lossy_threshold:g}: {self.lossy_accepted} tokens accepted without target check) "
            if self.lossy_threshold is not None else ""
        )
        monitor = (
            f", pass rate {self.verification_pass_rate:.2f} ({self.accepted_per_verified:.2f} per draft token), "
            f"wasted {self.wasted_share:.2f}" if self.draft_passes else ""
        )
        cache = (
            f", result cache hits {self.cache_hit_rate:.2f} (useful {self.cache_useful_rate:.2f}, "
            f"{self.cache_accepted_tokens} tokens)" if self.cache_steps else ""
        )
        return lossy + (
            f"{self.new_tokens} tokens in {self.total_seconds:.2f}s ({self.tokens_per_second:.1f} tok/s), "
            f"{self.target_passes} target passes, tau {self.tau:.2f}, acceptance {self.acceptance_rate:.2f}"
            + (f" [per position: {acc}]" if acc else "")
            + monitor + cache
            + f", draft {self.draft_seconds:.2f}s / verify {self.verify_seconds:.2f}s, finish: {self.finish_reason}"
        )


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only
    text: str
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # one per token, when the request asked for them


@dataclass
class Chunk:
    """One streamed step: the text and tokens it added; `result` is set on the last chunk."""

    text: str
    tokens: list[int]
    result: GenerationResult | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token of this chunk, when asked for
