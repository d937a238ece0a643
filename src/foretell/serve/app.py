"""The OpenAI-compatible app: request -> typed parameters -> the worker's queue -> stream or response.

Routes only translate: a body becomes a prompt's token ids and SamplingParams, engine chunks become OpenAI
objects. The engine is reached only through the worker (worker.py), which owns it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from foretell.api import Pipeline
from foretell.errors import ForetellError
from foretell.prefix_cache import PrefixCache
from foretell.serve.choices import Choices
from foretell.serve.metrics import ServerMetrics
from foretell.serve.protocol import (
    APIError, ChatCompletionRequest, CompletionRequest, from_validation_error, invalid, token_budget,
)
from foretell.serve.responses import SSE_DONE, ChatShape, CompletionShape, TokenText, sse, sse_error
from foretell.serve.settings import ServeSettings
from foretell.serve.worker import Cancelled, Channel, Job, QueueFull, ShuttingDown, TimeLimitExceeded, Worker
from foretell.sizing.batch import BatchAwareBudget, FixedByBatchSize

COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions; chat: the rest of the window


def create_app(pipeline: Pipeline, model_name: str, settings: ServeSettings, batch=None) -> FastAPI:
    """An app serving `pipeline` as `model_name`. The app owns one worker thread driving a batching engine
    (`batch`, by default one over the pipeline per the settings), started and stopped with the app's lifespan.
    Serve it with server.Server, which applies the settings' timeouts and says how the shutdown went."""
    server = Routes(pipeline, model_name, settings, batch)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.worker.start()
        yield
        await asyncio.to_thread(server.worker.stop)

    app = FastAPI(title="foretell", lifespan=lifespan)
    app.state.settings, app.state.worker = settings, server.worker
    add_error_handlers(app, server.metrics)
    app.add_api_route("/health", server.health, methods=["GET"])
    app.add_api_route("/metrics", server.prometheus, methods=["GET"])
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(server.require_key)])  # probes above need no key
    v1.add_api_route("/models", server.models, methods=["GET"])
    v1.add_api_route("/models/{name:path}", server.model, methods=["GET"])
    v1.add_api_route("/completions", server.completions, methods=["POST"])
    v1.add_api_route("/chat/completions", server.chat_completions, methods=["POST"])
    app.include_router(v1)
    return app


def make_batch(pipeline: Pipeline, settings: ServeSettings):
    """The batching engine the worker drives, with the budget policy the settings name."""
    budget = None
    if settings.batch_budget == "fixed":
        budget = FixedByBatchSize()
    elif settings.batch_budget == "auto" and pipeline.speculative.drafts:
        budget = BatchAwareBudget(cost=pipeline.weights.target_cost())
    return pipeline.batch_engine(budget, settings.max_batch, settings.prefill_chunk,
                                 PrefixCache.of_megabytes(settings.prefix_cache_mb))


class Routes:
    """What the routes share: the pipeline, the worker that owns its engine, metrics and settings."""

    def __init__(self, pipeline: Pipeline, model_name: str, settings: ServeSettings, batch=None):
        self.pipeline, self.model_name, self.settings = pipeline, model_name, settings
        self.metrics = ServerMetrics()
        self.worker = Worker(batch or make_batch(pipeline, settings), self.metrics, settings.max_queue)
        self.created = int(time.time())
        self.token_text = TokenText(pipeline.tokenizer)  # for log-probabilities

    def require_key(self, request: Request) -> None:
        """`Authorization: Bearer <key>`, the scheme in any case (RFC 9110 makes it case-insensitive)."""
        if self.settings.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        key = self.settings.api_key.encode()
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key):
            raise APIError(401, "missing or wrong API key: send the header Authorization: Bearer <key>",
                           code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="foretell"'})

    async def health(self) -> dict:
        if not self.worker.alive:
            raise APIError(503, "the engine worker is not running", type="server_error", code="unavailable")
        return {"status": "ok"}

    async def prometheus(self) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def _card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "foretell",
                "max_model_len": self.pipeline.engine.context_window,
                "speculative": self.pipeline.speculative.to_dict()}

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           code="model_not_found", param="model")

    async def models(self) -> dict:
        return {"object": "list", "data": [self._card()]}

    async def model(self, name: str) -> dict:
        self._check_model(name)
        return self._card()

    async def completions(self, request: Request) -> Response:
        req = await parse(request, CompletionRequest, self.settings)
        self._check_model(req.model)
        ids = self.pipeline.encode(req.text, chat=False)
        return await self._generate(request, req, ids, COMPLETION_DEFAULT_TOKENS, CompletionShape, "prompt")

    async def chat_completions(self, request: Request) -> Response:
        req = await parse(request, ChatCompletionRequest, self.settings)
        self._check_model(req.model)
        if not getattr(self.pipeline.tokenizer, "chat_template", None):
            raise invalid("this model has no chat template: use /v1/completions with a raw prompt")
        try:
            ids = self.pipeline.encode(req.template_messages(), chat=True)
        except Exception as e:  # the template is jinja run on the client's messages (it may raise on purpose)
            raise invalid(f"the model's chat template rejected these messages: {e}", param="messages") from None
        return await self._generate(request, req, ids, None, ChatShape, "messages")

    async def _generate(self, request: Request, req, prompt_ids: list[int], default_tokens: int | None, shape_type,
                        prompt_param: str) -> Response:
        """Queue the generation (a job per choice); stream it as server-sent events, or wait for it and answer once."""
        engine = self.pipeline.engine
        budget = token_budget(req.requested_tokens, default_tokens, len(prompt_ids), engine.context_window,
                              prompt_param)
        params = req.sampling(budget, engine.target.config.vocab_size)
        if params.response_format is not None:  # a schema the grammar refuses is the request's error, said now
            try:
                await asyncio.to_thread(engine.grammar_compiler().grammar, params.response_format)
            except ForetellError as e:
                raise invalid(str(e), param="response_format") from None
        method = self.pipeline.speculative.method if req.speculative else "none"
        shape = shape_type(self.model_name, method, self.token_text)
        loop = asyncio.get_running_loop()
        choices = Choices([Job(prompt_ids, replace(params, seed=seed), Channel(loop, self.settings.request_timeout),
                               engine=None if req.speculative else self.pipeline.plain_engine())
                           for seed in req.choice_seeds()])
        try:
            for job in choices.jobs:
                self.worker.submit(job)
        except QueueFull as e:
            choices.cancel("cancelled")  # the choices already queued leave with the rest
            raise APIError(503, f"{e}; retry later", type="server_error", code="queue_full",
                           headers={"Retry-After": str(self.settings.retry_after)}) from None
        except BaseException:
            choices.cancel("cancelled")
            raise
        if req.stream:
            return StreamingResponse(events(request, choices, shape, req.include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        results = [None] * choices.n
        async with cancel_when_gone(request, choices):
            async for index, chunk in choices.chunks():
                results[index] = chunk.result or results[index]
        return JSONResponse(shape.response(results).model_dump())


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body, refused with 413 past `limit` bytes without reading (or keeping) the rest, and with 408
    (the connection then closed) when it has not all come `timeout` seconds after the route began reading it: a
    client trickling its body a byte at a time would otherwise hold a connection and a task for ever, as the
    header timeout ends once the head is whole."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    try:
        return await asyncio.wait_for(_read_body(request, limit), timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive whole within {timeout:g} s (--body-timeout); send it "
                       "at once", code="body_timeout", headers={"Connection": "close"}) from None


async def _read_body(request: Request, limit: int) -> bytes:
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise too_large(len(body), limit)
    except ClientDisconnect:  # an answer nobody reads, not a server error with a traceback in the log
        raise Cancelled("the client left before sending its whole body") from None
    return bytes(body)


def too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"the request body has {'more than ' if size <= limit else ''}{size} bytes; this server "
                    f"takes at most {limit} (--max-body-bytes)", code="request_too_large")


def require_json(request: Request) -> None:
    """415 unless the body is declared JSON. Besides telling a client what is wrong, this keeps web pages off the
    server: a browser sends a cross-site POST without asking first (a CORS preflight) only for form and
    text/plain bodies, and a JSON one it never sends, as the server grants no cross-site access."""
    declared = request.headers.get("content-type", "")
    media, *params = (part.strip().lower() for part in declared.split(";"))
    charset = next((p.partition("=")[2].strip('"') for p in params if p.startswith("charset=")), "utf-8")
    if media != "application/json" or charset not in ("utf-8", "utf8"):
        got = f"Content-Type: {declared}" if declared else "no Content-Type"
        raise APIError(415, f"the body must be JSON in UTF-8, sent with Content-Type: application/json; got {got}",
                       code="unsupported_media_type")


async def parse(request: Request, model: type[BaseModel], settings: ServeSettings):
    require_json(request)
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise from_validation_error(e) from None


@asynccontextmanager
async def cancel_when_gone(request: Request, job: Job | Choices):
    """Cancel the job when the client disconnects, or when the request ends before the job did (an error,
    the time limit, or this request's task being cancelled): the worker then drops it and frees its cache."""

    async def watch() -> None:
        # The body was read in full, so the next message is the disconnect (or the response being complete).
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel("cancelled")

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()
        job.cancel("cancelled")  # a no-op when the job has finished


async def events(request: Request, choices: Choices, shape, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: the chunks of every choice (each with its index), each choice's closing chunk
    (finish_reason, speculative_decoding), usage if asked, then [DONE]. An error after the stream started (time
    limit) comes as an OpenAI error event before [DONE]."""
    async with cancel_when_gone(request, choices):
        try:
            for opening in shape.opening(choices.n):
                yield sse(opening)
            finished = []
            async for index, chunk in choices.chunks():
                if chunk.text or chunk.logprobs:
                    yield sse(shape.delta(chunk.text, index, chunk.logprobs))
                if chunk.result is not None:
                    finished.append(chunk.result.stats)
                    yield sse(shape.closing(chunk.result.stats, index))
            if include_usage:
                yield sse(shape.usage(finished))
        except Exception as e:
            yield sse_error(as_api_error(e).body())
        yield SSE_DONE


def as_api_error(e: Exception) -> APIError:
    """Every failure as an OpenAI error with its status."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ForetellError):
        return invalid(str(e))
    if isinstance(e, TimeLimitExceeded):  # a retry would take as long: tell the OpenAI client not to
        return APIError(504, str(e), type="server_error", code="timeout", headers={"x-should-retry": "false"})
    if isinstance(e, ShuttingDown):
        return APIError(503, str(e), type="server_error", code="shutting_down")
    if isinstance(e, Cancelled):  # nginx's "client closed request": nobody reads this answer
        return APIError(499, "the request was cancelled", code="cancelled")
    if isinstance(e, StarletteHTTPException):
        code = "not_found" if e.status_code == 404 else None
        return APIError(e.status_code, f"{e.detail} ({e.status_code})", code=code)
    return APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")


def add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    async def handle(request: Request, e: Exception) -> JSONResponse:
        error = as_api_error(e)
        if error.status != 499:  # a client that left is counted as an aborted request, not an error
            metrics.errors.labels(status=str(error.status)).inc()
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    kinds = (APIError, ForetellError, TimeLimitExceeded, ShuttingDown, Cancelled, StarletteHTTPException, Exception)
    for kind in kinds:
        app.add_exception_handler(kind, handle)
