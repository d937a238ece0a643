"""OpenAI response bodies and stream chunks, plus the speculative decoding statistics of each response.

Two shapes, one interface: the routes stream or collect engine chunks the same way and a shape turns them
into text_completion or chat.completion(.chunk) objects.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, model_serializer

from foretell.types import GenerationStats


class _Out(BaseModel):
    """Fields named in OMIT_NONE are left out when None (OpenAI omits them); every other None is sent as null."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit(self, handler) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if not (k in self.OMIT_NONE and v is None)}


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, stats: GenerationStats) -> Usage:
        return cls(prompt_tokens=stats.prompt_tokens, completion_tokens=stats.new_tokens,
                   total_tokens=stats.prompt_tokens + stats.new_tokens)


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
    def of(cls, method: str, stats: GenerationStats) -> SpeculativeDecoding:
        return cls(method=method, num_drafts=stats.draft_passes, num_draft_tokens=stats.draft_tokens_verified,
                   num_accepted_tokens=stats.accepted_tokens, mean_acceptance_length=round(stats.tau, 4),
                   acceptance_by_position=[round(a, 4) for a in stats.acceptance_per_position],
                   target_passes=stats.target_passes)


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
    logprobs: None = None
    finish_reason: str | None = None


class ChatChoice(_Out):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str


class ChatChunkChoice(_Out):
    index: int = 0
    delta: Delta
    logprobs: None = None
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

    def __init__(self, model: str, method: str):
        self.id, self.created, self.model, self.method = f"{self.PREFIX}-{uuid.uuid4().hex}", int(time.time()), model, method

    def _object(self, cls: type[_Response], choices: list, **extra) -> _Response:
        return cls(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def usage(self, stats: GenerationStats) -> BaseModel:
        return self._object(self.CHUNK, [], usage=Usage.of(stats))


class CompletionShape(_Shape):
    """text_completion objects for one request."""

    PREFIX, CHUNK = "cmpl", Completion

    def _chunk(self, text: str, finish: str | None = None, **extra) -> Completion:
        return self._object(Completion, [CompletionChoice(text=text, finish_reason=finish)], **extra)

    def opening(self) -> list[BaseModel]:
        return []

    def delta(self, text: str) -> BaseModel:
        return self._chunk(text)

    def closing(self, stats: GenerationStats) -> BaseModel:
        return self._chunk("", stats.finish_reason, speculative_decoding=SpeculativeDecoding.of(self.method, stats))

    def response(self, text: str, stats: GenerationStats) -> BaseModel:
        return self._chunk(text, stats.finish_reason, usage=Usage.of(stats),
                           speculative_decoding=SpeculativeDecoding.of(self.method, stats))


class ChatShape(_Shape):
    """chat.completion and chat.completion.chunk objects for one request."""

    PREFIX, CHUNK = "chatcmpl", ChatCompletionChunk

    def _chunk(self, delta: Delta, finish: str | None = None, **extra) -> ChatCompletionChunk:
        return self._object(ChatCompletionChunk, [ChatChunkChoice(delta=delta, finish_reason=finish)], **extra)

    def opening(self) -> list[BaseModel]:
        return [self._chunk(Delta(role="assistant", content=""))]

    def delta(self, text: str) -> BaseModel:
        return self._chunk(Delta(content=text))

    def closing(self, stats: GenerationStats) -> BaseModel:
        spec = SpeculativeDecoding.of(self.method, stats)
        return self._chunk(Delta(), stats.finish_reason, speculative_decoding=spec)

    def response(self, text: str, stats: GenerationStats) -> BaseModel:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=stats.finish_reason)
        return self._object(ChatCompletion, [choice], usage=Usage.of(stats),
                            speculative_decoding=SpeculativeDecoding.of(self.method, stats))
