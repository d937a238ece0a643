"""OpenAI request bodies (pydantic, strict), the OpenAI error body, and requests -> SamplingParams.

Bodies are validated strictly: a wrong type is an error rather than a silent coercion, an unknown field is an
error rather than ignored, and a field of the OpenAI API this server does not implement (tools, echo, ...) is
accepted only at its neutral value, so no request is answered as if it had been honoured.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from foretell.errors import ForetellError
from foretell.types import ResponseFormat, SamplingParams

# torch.Generator.manual_seed takes seeds in this range.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
MAX_STOP_STRINGS = 16
MAX_CHOICES = 16  # n: each choice is a request of its own in the batch
MAX_TOP_LOGPROBS = 20
MAX_TOKEN_ID_DIGITS = 9  # past any vocabulary, and short of int()'s limit on digits

# OpenAI fields this server does not implement -> the values that mean "off", which it accepts.
NEUTRAL: dict[str, tuple] = {
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
}


class APIError(Exception):
    """An error answered in the OpenAI format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, code=code, param=param)


def from_validation_error(e: ValidationError) -> APIError:
    """pydantic's errors as one 400: malformed JSON, or the first few fields that are wrong."""
    errors = e.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        return invalid(f"the request body is not valid JSON: {errors[0]['msg']}")
    parts = []
    for err in errors[:3]:
        where = ".".join(str(x) for x in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return invalid("invalid request: " + "; ".join(parts) + more, param=field_of(errors[0]) if errors else None)


class FieldError(ValueError):
    """A check across a request's fields that fails because of one of them: its 400 names it in `param`."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def field_of(error: dict) -> str | None:
    """The top-level field one pydantic error is about: from its location, else from a FieldError."""
    if error["loc"]:
        return str(error["loc"][0])
    return getattr((error.get("ctx") or {}).get("error"), "param", None)


def null_is_default(model: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """OpenAI's API takes null for an optional field and reads it as the field's default (its SDKs and many
    clients send every field, unset ones as null): a field whose default is not None reads null so too."""
    return model.model_fields[info.field_name].default if value is None else value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's option; accepted, usage still comes once at the end

    @field_validator("include_usage", "continuous_usage_stats", mode="before")
    @classmethod
    def _null(cls, value, info):
        return null_is_default(cls, value, info)


class _GenerationRequest(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # OpenAI's range; default 1.0 as in OpenAI
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM's extension: -1 or 0 = off
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)  # independent samples, decoded together in the batch
    user: str | None = None  # an end-user id for logs; not used
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)  # vLLM's extension; 1 = off
    logit_bias: dict[str, float] | None = None
    speculative: bool = True  # foretell's extension: false decodes this request plainly (no drafts)
    # foretell's extension "sampling": how sampled tokens are chosen (SamplingParams.sampling); None: coupled with a
    # seed, else rejection. Named apart from the method `sampling`, which it would shadow.
    sampling_rule: Literal["coupled", "rejection"] | None = Field(None, alias="sampling")

    @field_validator("stream", "n", "speculative", mode="before")
    @classmethod
    def _null(cls, value, info):
        return null_is_default(cls, value, info)

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            # str.isdigit alone takes "²" or "٣", which int() then refuses; a token id has a handful of digits
            if not (key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_ID_DIGITS):
                shown = repr(key) if len(key) <= 24 else f"{key[:12]!r}... ({len(key)} characters)"
                raise ValueError(f"keys are token ids (non-negative integers written in ASCII digits, at most "
                                 f"{MAX_TOKEN_ID_DIGITS} of them), got {shown}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"values must be in [-100, 100], got {value} for token {key}")
        return bias

    @model_validator(mode="after")
    def _supported(self):
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "stream_options is only allowed with stream: true")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise FieldError("stop", f"stop takes 1 to {MAX_STOP_STRINGS} non-empty strings")
        for name, neutral in NEUTRAL.items():
            value = getattr(self, name, None)
            if not any(value == v and type(value) is type(v) for v in neutral):
                raise FieldError(name, f"{name} is not supported by this server; leave it out (got {value!r})")
        return self

    @property
    def requested_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def token_logprobs(self) -> tuple[bool, int]:
        """(each token's log-probability wanted, how many of the most likely tokens with it)."""
        return False, 0

    @property
    def response_format_type(self) -> ResponseFormat | None:
        return None

    def sampling(self, max_new_tokens: int, vocab_size: int | None = None) -> SamplingParams:
        """The engine's parameters; OpenAI's defaults where the request says nothing (temperature 1). vocab_size:
        the target's, which logit_bias's token ids must fall in."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        bias = {int(k): v for k, v in (self.logit_bias or {}).items()}
        if vocab_size is not None and any(t >= vocab_size for t in bias):
            raise invalid(f"logit_bias: token {max(bias)} is not in the model's vocabulary (ids 0 to {vocab_size - 1})",
                          param="logit_bias")
        logprobs, top = self.token_logprobs
        try:
            return SamplingParams(
                temperature=1.0 if self.temperature is None else float(self.temperature),
                top_k=max(self.top_k or 0, 0), top_p=1.0 if self.top_p is None else float(self.top_p),
                seed=self.seed, sampling=self.sampling_rule, max_new_tokens=max_new_tokens, stop=stop,
                presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
                repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                logit_bias=bias, logprobs=logprobs, top_logprobs=top, response_format=self.response_format_type,
            )
        except ForetellError as e:  # the engine's checks name the parameter first, as the request spells it
            named = next((f for f in type(self).model_fields if str(e).startswith(f + " ")), None)
            raise invalid(str(e), param=named) from None

    def choice_seeds(self) -> list[int | None]:
        """Each choice's seed: the request's, then the next ones, so n seeded choices differ yet repeat."""
        if self.seed is None:
            return [None] * self.n
        return [(self.seed + i - SEED_MIN) % (SEED_MAX - SEED_MIN + 1) + SEED_MIN for i in range(self.n)]


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: a raw prompt, no chat template."""

    prompt: str | list[str]
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # the legacy API: how many top tokens, with each

    @property
    def token_logprobs(self) -> tuple[bool, int]:
        return self.logprobs is not None, self.logprobs or 0

    @model_validator(mode="after")
    def _one_prompt(self):
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise FieldError("prompt", f"prompt: one prompt per request, got a list of {len(self.prompt)}")
        return self

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class JsonSchemaBody(BaseModel):
    """response_format.json_schema: the schema and its name (OpenAI's `strict` is accepted; output always follows
    the schema)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormatBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaBody | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise FieldError("response_format", "json_schema (an object holding the schema) goes with type "
                             "json_schema, and only with it")
        return self

    def engine_format(self) -> ResponseFormat | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return ResponseFormat("json_object")
        return ResponseFormat("json_schema", json.dumps(self.json_schema.schema_ or {"type": "object"}))


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template_message(self) -> dict:
        """The {role, content} a chat template takes; OpenAI's newer "developer" role is the system one."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions: messages through the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: ResponseFormatBody | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _top_with_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        return self

    @property
    def token_logprobs(self) -> tuple[bool, int]:
        return bool(self.logprobs), self.top_logprobs or 0

    @property
    def response_format_type(self) -> ResponseFormat | None:
        return None if self.response_format is None else self.response_format.engine_format()

    @model_validator(mode="after")
    def _one_limit(self):
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise FieldError("max_completion_tokens", "max_tokens and max_completion_tokens disagree: give one")
        return self

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict]:
        return [m.as_template_message() for m in self.messages]


def token_budget(requested: int | None, default: int | None, prompt_tokens: int, context_window: int,
                 prompt_param: str) -> int:
    """max_new_tokens for a request: what it asked for, checked against the context window; when it asked
    for nothing, `default` (None = the rest of the window) capped by the room left."""
    room = context_window - prompt_tokens
    if room < 1:
        raise invalid(f"the prompt has {prompt_tokens} tokens but the model's context window is {context_window}; "
                      "shorten the prompt", param=prompt_param, code="context_length_exceeded")
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise invalid(f"the model's context window is {context_window} tokens: the prompt has {prompt_tokens}, "
                      f"so at most {room} can be generated, but {requested} were requested; lower max_tokens",
                      param="max_tokens", code="context_length_exceeded")
    return requested
