"""OpenAI response bodies and stream chunks, plus the speculative decoding statistics of each response.

Two shapes, one interface: the routes stream or collect engine chunks the same way and a shape turns them
into text_completion or chat.completion(.chunk) objects, with each choice's index and, when asked for, its
tokens' log-probabilities.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, model_serializer

from foretell.types import GenerationResult, GenerationStats, TokenLogprob

LOGPROB_FLOOR = -9999.0  # JSON has no -infinity; a token the processing ruled out reads as this (vLLM's value)


class _Out(BaseModel):
    """Fields named in OMIT_NONE are left out when None (OpenAI omits them); every other None is sent as null."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit(self, handler) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if not (k in self.OMIT_NONE and v is None)}


class PromptTokensDetails(_Out):
    cached_tokens: int  # read from the prefix cache, not computed again (as OpenAI reports its prompt caching)


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, stats: GenerationStats | list[GenerationStats]) -> Usage:
        """One request's usage: its prompt once, the tokens of all its choices."""
        stats = stats if isinstance(stats, list) else [stats]
        new = sum(s.new_tokens for s in stats)
        return cls(prompt_tokens=stats[0].prompt_tokens, completion_tokens=new, total_tokens=stats[0].prompt_tokens + new,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=stats[0].cached_prompt_tokens))


class SpeculativeDecoding(_Out):
    """Per response, as vLLM's per-request speculative decoding stats: drafts (passes that verified draft
    tokens), draft tokens verified (tree nodes for tree drafters), accepted tokens, mean acceptance length
    (tau: accepted drafts + 1 per target pass) and the acceptance rate at each draft position."""

    method: str
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    mean_acceptance_length: float
    acceptance_by_position: list[float]
    target_passes: int

    @classmethod
    def of(cls, method: str, stats: GenerationStats | list[GenerationStats]) -> SpeculativeDecoding:
        """A choice's statistics, or a request's over all its choices."""
        stats = merged(stats) if isinstance(stats, list) else stats
        return cls(method=method, num_drafts=stats.draft_passes, num_draft_tokens=stats.draft_tokens_verified,
                   num_accepted_tokens=stats.accepted_tokens, mean_acceptance_length=round(stats.tau, 4),
                   acceptance_by_position=[round(a, 4) for a in stats.acceptance_per_position],
                   target_passes=stats.target_passes)


def merged(stats: list[GenerationStats]) -> GenerationStats:
    """Several choices' speculation counts as one (what SpeculativeDecoding reads)."""
    if len(stats) == 1:
        return stats[0]
    total = GenerationStats(prompt_tokens=stats[0].prompt_tokens)
    for s in stats:
        for name in ("new_tokens", "target_passes", "draft_passes", "draft_tokens_verified"):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        for counts, more in ((total.proposed_per_position, s.proposed_per_position),
                             (total.accepted_per_position, s.accepted_per_position)):
            counts.extend([0] * (len(more) - len(counts)))
            for i, c in enumerate(more):
                counts[i] += c
    return total


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionLogprobs(_Out):
    """The legacy completions form: parallel lists, top_logprobs as {token text: log-probability}."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TokenText:
    """Token ids -> their text (as each would decode alone), remembered."""

    def __init__(self, tokenizer):
        self.tokenizer, self._seen = tokenizer, {}

    def __call__(self, token: int) -> str:
        if token not in self._seen:
            self._seen[token] = self.tokenizer.decode([token])
        return self._seen[token]


def _value(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


class AssistantMessage(_Out):
    role: str = "assistant"
    content: str


class Delta(_Out):
    OMIT_NONE = ("role", "content")
    role: str | None = None
    content: str | None = None


class CompletionChoice(_Out):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class ChatChoice(_Out):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatChunkChoice(_Out):
    index: int = 0
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


Choice = TypeVar("Choice")


class _Response(_Out, Generic[Choice]):
    """The fields of every response object and stream chunk; a subclass names its `object` and choice type
    (pydantic keeps a redeclared field where the base declared it, so the JSON keys keep this order)."""

    OMIT_NONE = ("usage", "speculative_decoding")
    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    speculative_decoding: SpeculativeDecoding | None = None


class Completion(_Response[CompletionChoice]):
    """A text_completion: the whole response, or one stream chunk (OpenAI uses the same object for both)."""

    object: str = "text_completion"


class ChatCompletion(_Response[ChatChoice]):
    OMIT_NONE = ("speculative_decoding",)
    object: str = "chat.completion"
    usage: Usage


class ChatCompletionChunk(_Response[ChatChunkChoice]):
    object: str = "chat.completion.chunk"


def sse(obj: BaseModel | str) -> str:
    """One server-sent event."""
    return f"data: {obj if isinstance(obj, str) else obj.model_dump_json()}\n\n"


def sse_error(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class _Shape:
    """What both shapes do alike: every object of one request carries its id (PREFIX-hex), creation time and
    model; a stream that asked for usage ends with a CHUNK holding it and no choices."""

    PREFIX: ClassVar[str]
    CHUNK: ClassVar[type[_Response]]

    def __init__(self, model: str, method: str, token_text: TokenText | None = None):
        """token_text: renders tokens for log-probabilities (needed when a request asks for them)."""
        self.id, self.created, self.model, self.method = f"{self.PREFIX}-{uuid.uuid4().hex}", int(time.time()), model, method
        self.token_text = token_text

    def _object(self, cls: type[_Response], choices: list, **extra) -> _Response:
        return cls(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def usage(self, stats: list[GenerationStats]) -> BaseModel:
        return self._object(self.CHUNK, [], usage=Usage.of(stats))

    def _top(self, token: int, logprob: float) -> TopLogprob:
        text = self.token_text(token)
        return TopLogprob(token=text, logprob=_value(logprob), bytes=list(text.encode()))


class CompletionShape(_Shape):
    """text_completion objects for one request."""

    PREFIX, CHUNK = "cmpl", Completion

    def __init__(self, model: str, method: str, token_text: TokenText | None = None):
        super().__init__(model, method, token_text)
        self._offsets: dict[int, int] = {}  # a streamed choice's text_offset so far

    def _chunk(self, text: str, index: int, finish: str | None = None, logprobs=None, **extra) -> Completion:
        choice = CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=logprobs)
        return self._object(Completion, [choice], **extra)

    def _logprobs(self, logprobs: list[TokenLogprob] | None, streamed: int | None = None) -> CompletionLogprobs | None:
        """streamed: the choice's index when its text comes in pieces (text_offset goes on from the last piece)."""
        if logprobs is None:
            return None
        tokens = [self.token_text(lp.token) for lp in logprobs]
        offsets, at = [], self._offsets.get(streamed, 0)
        for text in tokens:
            offsets.append(at)
            at += len(text)
        if streamed is not None:
            self._offsets[streamed] = at
        return CompletionLogprobs(tokens=tokens, token_logprobs=[_value(lp.logprob) for lp in logprobs],
                                  top_logprobs=[{self.token_text(t): _value(v) for t, v in lp.top} for lp in logprobs],
                                  text_offset=offsets)

    def opening(self, n: int) -> list[BaseModel]:
        return []

    def delta(self, text: str, index: int = 0, logprobs: list[TokenLogprob] | None = None) -> BaseModel:
        return self._chunk(text, index, logprobs=self._logprobs(logprobs, index))

    def closing(self, stats: GenerationStats, index: int = 0) -> BaseModel:
        return self._chunk("", index, stats.finish_reason,
                           speculative_decoding=SpeculativeDecoding.of(self.method, stats))

    def response(self, results: list[GenerationResult]) -> BaseModel:
        choices = [CompletionChoice(index=i, text=r.text, finish_reason=r.stats.finish_reason,
                                    logprobs=self._logprobs(r.logprobs)) for i, r in enumerate(results)]
        stats = [r.stats for r in results]
        return self._object(Completion, choices, usage=Usage.of(stats),
                            speculative_decoding=SpeculativeDecoding.of(self.method, stats))


class ChatShape(_Shape):
    """chat.completion and chat.completion.chunk objects for one request."""

    PREFIX, CHUNK = "chatcmpl", ChatCompletionChunk

    def _chunk(self, delta: Delta, index: int, finish: str | None = None, logprobs=None, **extra) -> ChatCompletionChunk:
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)
        return self._object(ChatCompletionChunk, [choice], **extra)

    def _logprobs(self, logprobs: list[TokenLogprob] | None) -> ChatLogprobs | None:
        if logprobs is None:
            return None
        content = []
        for lp in logprobs:
            text = self.token_text(lp.token)
            content.append(ChatTokenLogprob(token=text, logprob=_value(lp.logprob), bytes=list(text.encode()),
                                            top_logprobs=[self._top(t, v) for t, v in lp.top]))
        return ChatLogprobs(content=content)

    def opening(self, n: int) -> list[BaseModel]:
        return [self._chunk(Delta(role="assistant", content=""), i) for i in range(n)]

    def delta(self, text: str, index: int = 0, logprobs: list[TokenLogprob] | None = None) -> BaseModel:
        return self._chunk(Delta(content=text), index, logprobs=self._logprobs(logprobs))

    def closing(self, stats: GenerationStats, index: int = 0) -> BaseModel:
        spec = SpeculativeDecoding.of(self.method, stats)
        return self._chunk(Delta(), index, stats.finish_reason, speculative_decoding=spec)

    def response(self, results: list[GenerationResult]) -> BaseModel:
        choices = [ChatChoice(index=i, message=AssistantMessage(content=r.text), finish_reason=r.stats.finish_reason,
                              logprobs=self._logprobs(r.logprobs)) for i, r in enumerate(results)]
        stats = [r.stats for r in results]
        return self._object(ChatCompletion, choices, usage=Usage.of(stats),
                            speculative_decoding=SpeculativeDecoding.of(self.method, stats))
