"""The one thread that owns the engine: a bounded queue of jobs, served one at a time.

A request becomes a Job (prompt ids, SamplingParams, a Channel back to the request's event loop). The worker
runs the engine's stream for it and sends each Chunk through the channel. Between chunks it checks whether
the job was cancelled (the client went away, or its time limit passed): then it closes the engine's
generator, whose frame holds the request's KV cache, so the memory is freed at once rather than after the
whole generation. The server never touches the decode loop itself.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterator

from foretell.engine import Chunk
from foretell.errors import ForetellError
from foretell.serve.metrics import ServerMetrics
from foretell.types import SamplingParams

log = logging.getLogger("foretell.serve")

END = object()  # the last item a channel carries after the final chunk


class QueueFull(Exception):
    """The queue holds max_queue requests already."""


class ShuttingDown(Exception):
    """The server stopped before the request was served."""


class TimeLimitExceeded(Exception):
    """The request ran past the server's per-request time limit."""


class Cancelled(Exception):
    """The worker stopped a job that was cancelled (its client went away): ends the request's wait."""


class Channel:
    """Items from the worker thread to one request's event loop: Chunks, then END; or an exception.

    The receiving side enforces the request's time limit, so a request waiting in the queue times out too.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, time_limit: float):
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.time_limit = time_limit
        self.deadline = loop.time() + time_limit

    def send(self, item) -> None:
        """From the worker thread."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            pass

    async def chunks(self) -> AsyncIterator[Chunk]:
        """The job's chunks; raises what the worker sent, or TimeLimitExceeded at the deadline."""
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), max(self.deadline - self._loop.time(), 0.0))
            except asyncio.TimeoutError:
                raise TimeLimitExceeded(f"the request took longer than this server's limit of {self.time_limit:g} s "
                                        "(waiting included)") from None
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


@dataclass(eq=False)
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    channel: Channel
    queued_at: float = field(default_factory=time.monotonic)
    # Set from the request's thread, read by the worker between chunks (an attribute write is atomic).
    cancel_reason: str | None = None

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason

    async def chunks(self) -> AsyncIterator[Chunk]:
        """The channel's chunks; a request past its time limit is cancelled so the worker drops it."""
        try:
            async for chunk in self.channel.chunks():
                yield chunk
        except TimeLimitExceeded:
            self.cancel("timeout")
            raise


class Worker:
    """stream: the engine's `stream(prompt_ids, params) -> Iterator[Chunk]`, only ever called from this thread."""

    def __init__(self, stream: Callable[[list[int], SamplingParams], Iterator[Chunk]], metrics: ServerMetrics,
                 max_queue: int):
        self._stream = stream
        self._metrics = metrics
        self._jobs: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._closing.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="foretell-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull or ShuttingDown when it cannot be."""
        if self._closing.is_set():
            raise ShuttingDown("the server is shutting down")
        self._metrics.waiting.inc()  # before the put, so the worker's dec never comes first
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self._metrics.waiting.dec()
            raise QueueFull(f"the server is busy: {self._jobs.maxsize} requests are already waiting") from None

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the running job, fail the waiting ones, and wait for the thread."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            self._metrics.waiting.dec()
            self._stopped_early(job, "shutdown")

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                job = self._jobs.get(timeout=0.25)  # wakes up to notice stop()
            except queue.Empty:
                continue
            self._metrics.waiting.dec()
            self._serve(job)

    def _reason_to_stop(self, job: Job) -> str | None:
        return job.cancel_reason or ("shutdown" if self._closing.is_set() else None)

    def _serve(self, job: Job) -> None:
        start = time.monotonic()
        if reason := self._reason_to_stop(job):  # gone or timed out while waiting
            self._stopped_early(job, reason)
            return
        self._metrics.queue_time.observe(start - job.queued_at)
        self._metrics.running.inc()
        stream = self._stream(job.prompt_ids, job.params)
        outcome, ttft, last = "error", None, start
        try:
            for chunk in stream:
                now = time.monotonic()
                if ttft is None:
                    ttft = now - job.queued_at
                    self._metrics.ttft.observe(ttft)
                else:
                    self._metrics.itl.observe(now - last)
                last = now
                job.channel.send(chunk)
                if chunk.result is not None:
                    self._metrics.finished(chunk.result.stats, now - job.queued_at, ttft)
                    outcome = None
                    job.channel.send(END)
                    break
                if reason := self._reason_to_stop(job):
                    outcome = reason
                    break
            else:
                job.channel.send(RuntimeError("the engine stopped without a result"))
        except Exception as e:  # bad input only the engine could see (ForetellError), or a bug: tell the request
            if not isinstance(e, ForetellError):
                log.exception("generation failed")
            job.channel.send(e)
        finally:
            stream.close()  # its frame holds the KV cache: free it now, not when the generation would have ended
            self._metrics.running.dec()
            if outcome == "error":
                self._metrics.aborted.labels(reason="error").inc()
            elif outcome:
                self._stopped_early(job, outcome)

    def _stopped_early(self, job: Job, reason: str) -> None:
        """Count a job stopped before its end and end its request's wait (the request may be gone already)."""
        self._metrics.aborted.labels(reason=reason).inc()
        job.channel.send(ShuttingDown("the server is shutting down") if reason == "shutdown" else Cancelled(reason))
