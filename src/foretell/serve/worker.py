"""The one thread that owns the engine: a bounded queue of jobs, served together by a batching engine.

A request becomes a Job (prompt ids, SamplingParams, a Channel back to the request's event loop). The worker
moves jobs from the queue into the batch (batching.py) whenever it has room, runs its passes, and sends each
job's Chunks through its channel. Between passes it checks which jobs were cancelled (the client went away, or
its time limit passed): those leave the batch before the next pass, and their KV caches go with them. The
server never touches the decode loop itself.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, TypeVar

import torch

from foretell.errors import ForetellError
from foretell.serve.metrics import ServerMetrics
from foretell.types import Chunk, SamplingParams

log = logging.getLogger("foretell.serve")

END = object()  # the last item a channel carries after the final chunk
T = TypeVar("T")


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc only): after a busy batch the allocator keeps the
    peak's worth of freed buffers, which reads as growth in the server's RSS."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def on_a_passing_thread(make: Callable[[], T], threads: int) -> T:
    """make() on a thread of its own that then ends (its exception re-raised here), with `threads` torch threads.

    Why: libgomp gives each thread that opens an OpenMP region its own pool of helper threads, and once it manages
    more threads than there are CPUs it stops spinning between regions (a futex wake-up for each of a step's many
    regions). A model loaded and warmed up on the main thread and then stepped on the engine thread left two pools
    on 2 cores: SmolLM2's one-token steps took ~7 ms instead of ~5, and a stream through the server ran at 0.65x
    the engine's speed. A pool goes with its thread, so the server loads its model here and the main thread, which
    runs the event loop, never opens a region."""
    out: list = []

    def run() -> None:
        torch.set_num_threads(threads)
        try:
            out.append((True, make()))
        except BaseException as e:  # noqa: BLE001 (re-raised on the caller's thread)
            out.append((False, e))

    thread = threading.Thread(target=run, name="foretell-load")
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


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
    engine: object = None  # its own Engine (e.g. plain decoding for a request that turned speculation off); None: the batch's
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


@dataclass(eq=False)
class Running:
    """A job in the batch, with what its metrics need."""

    job: Job
    started: float
    request: object = None  # its batching.Request
    ttft: float | None = None
    last: float = 0.0
    done: bool = False


class Worker:
    """batch: a batching.BatchEngine, only ever driven from this thread."""

    def __init__(self, batch, metrics: ServerMetrics, max_queue: int):
        self._threads = torch.get_num_threads()  # the creating thread's setting (--threads): a new thread has its own
        self._batch = batch
        self._metrics = metrics
        self._jobs: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: list[Running] = []
        # Requests a client still waited for that ended because the server stopped (for the exit message).
        self.ended_by_shutdown = 0

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._closing.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="foretell-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull or ShuttingDown when it cannot be."""
        if self._closing.is_set():
            self.ended_by_shutdown += 1
            raise ShuttingDown("the server is shutting down")
        self._metrics.waiting.inc()  # before the put, so the worker's dec never comes first
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self._metrics.waiting.dec()
            raise QueueFull(f"the server is busy: {self._jobs.maxsize} requests are already waiting") from None

    def stop(self, timeout: float = 10.0) -> int:
        """End the running and the waiting jobs with ShuttingDown and wait for the thread; returns how many
        requests (whose clients still waited) the server's stopping has ended so far. Stopping twice is fine."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            self._metrics.waiting.dec()
            self._stopped_early(job, self._reason_to_stop(job))
        return self.ended_by_shutdown

    def _run(self) -> None:
        torch.set_num_threads(self._threads)
        while not self._closing.is_set():
            self._admit(block=not self._running)
            self._drop_stopped()
            if self._running:
                try:
                    self._batch.step()
                except Exception:  # a bug in a pass: every job in it gets the error, the server goes on
                    log.exception("a batched pass failed")
                    for run in self._running:
                        run.request.cancel()  # it leaves the batch before the next pass
                        self._fail(run, RuntimeError("generation failed: see the server log"))
                self._running = [r for r in self._running if not r.done]
                if not self._running:
                    release_free_memory()
        for run in self._running:
            if not run.done:
                run.request.cancel()
                self._stopped_early(run.job, self._reason_to_stop(run.job))
                self._end(run)

    def _admit(self, block: bool) -> None:
        """Jobs from the queue into the batch while it has room (waiting briefly for one when nothing runs)."""
        while len(self._running) < self._batch.max_batch:
            try:
                job = self._jobs.get(timeout=0.25) if block else self._jobs.get_nowait()  # wakes up to notice stop()
            except queue.Empty:
                return
            block = False
            self._metrics.waiting.dec()
            start = time.monotonic()
            if reason := self._reason_to_stop(job):  # gone or timed out while waiting
                self._stopped_early(job, reason)
                continue
            self._metrics.queue_time.observe(start - job.queued_at)
            self._metrics.running.inc()
            run = Running(job, start, last=start)
            run.request = self._batch.submit(job.prompt_ids, job.params, lambda c, r=run: self._chunk(r, c),
                                             lambda e, r=run: self._fail(r, e), engine=job.engine)
            self._running.append(run)

    def _chunk(self, run: Running, chunk: Chunk) -> None:
        now = time.monotonic()
        if run.ttft is None:
            run.ttft = now - run.job.queued_at
            self._metrics.ttft.observe(run.ttft)
        else:
            self._metrics.itl.observe(now - run.last)
        run.last = now
        run.job.channel.send(chunk)
        if chunk.result is not None:
            self._metrics.finished(chunk.result.stats, now - run.job.queued_at, run.ttft)
            run.job.channel.send(END)
            self._end(run)

    def _fail(self, run: Running, error: Exception) -> None:
        if not isinstance(error, ForetellError):
            log.error("generation failed: %s", error)
        run.job.channel.send(error)
        self._metrics.aborted.labels(reason="error").inc()
        self._end(run)

    def _end(self, run: Running) -> None:
        if not run.done:
            run.done = True
            self._metrics.running.dec()

    def _drop_stopped(self) -> None:
        """Cancelled or timed-out jobs leave the batch before the next pass."""
        for run in self._running:
            if not run.done and (reason := self._reason_to_stop(run.job)):
                run.request.cancel()
                self._stopped_early(run.job, reason)
                self._end(run)
        self._batch.sweep()
        self._running = [r for r in self._running if not r.done]

    def _reason_to_stop(self, job: Job) -> str | None:
        return job.cancel_reason or ("shutdown" if self._closing.is_set() else None)

    def _stopped_early(self, job: Job, reason: str) -> None:
        """Count a job stopped before its end and end its request's wait (the request may be gone already)."""
        self._metrics.aborted.labels(reason=reason).inc()
        if reason == "shutdown":
            self.ended_by_shutdown += 1
            job.channel.send(ShuttingDown("the server shut down before this request finished"))
        else:
            job.channel.send(Cancelled(reason))
