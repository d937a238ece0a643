"""Helpers for the server tests: a real uvicorn server on a free 127.0.0.1 port, a stand-in engine."""

from __future__ import annotations

import re
import socket
import threading
import time
from contextlib import contextmanager

import httpx

from foretell.types import Chunk, GenerationResult, GenerationStats


@contextmanager
def serving(app):
    """Serve `app` as `foretell serve` does (serve/server.py) in a background thread; yields the server and its
    base URL. The socket is bound here, on a free port, and handed to uvicorn, so no other process can take the
    port in between. Leaving the block shuts the server down as SIGTERM would."""
    from foretell.serve.server import Server

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = Server(app, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield server, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@contextmanager
def running(app):
    """serving(app), yielding only the base URL."""
    with serving(app) as (_, url):
        yield url


def metric(base_url: str, name: str, **labels) -> float:
    """One sample of the server's /metrics (0 when absent)."""
    text = httpx.get(f"{base_url}/metrics").text
    want = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    for line in text.splitlines():
        m = re.match(r"^([^\s{]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) == name and (m.group(2) or "") == want:
            return float(m.group(3))
    return 0.0


def wait_until(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class StandInBatch:
    """Replaces the batching engine where a test needs control over time: each request waits for `gate`, then
    gets `tokens` one-token chunks, one a pass, passes `delay` seconds apart. Records how each request ended."""

    def __init__(self, tokens: int = 100, delay: float = 0.02, max_batch: int = 1):
        self.tokens, self.delay, self.max_batch = tokens, delay, max_batch
        self.gate = threading.Event()
        self.gate.set()
        self.completed = 0
        self.closed_after: list[int] = []  # chunks sent before a request was cancelled
        self.active: list[StandInRequest] = []

    @property
    def idle(self) -> bool:
        return not self.active

    def submit(self, prompt_ids, params, on_chunk, on_error, engine=None):
        request = StandInRequest(len(prompt_ids), on_chunk)
        self.active.append(request)
        return request

    def sweep(self) -> None:
        for r in self.active:
            if r.cancelled:
                self.closed_after.append(r.sent)
        self.active = [r for r in self.active if not r.cancelled]

    def step(self) -> None:
        assert self.gate.wait(30)
        self.sweep()
        for r in self.active:
            r.sent += 1
            if r.sent < self.tokens:
                r.on_chunk(Chunk("w1 ", [4]))
                continue
            stats = GenerationStats(prompt_tokens=r.prompt_tokens, new_tokens=self.tokens, target_passes=self.tokens,
                                    finish_reason="length")
            self.completed += 1
            r.on_chunk(Chunk("w1", [4], GenerationResult([4] * self.tokens, "w1 " * (self.tokens - 1) + "w1", stats)))
            r.done = True
        self.active = [r for r in self.active if not r.done]
        time.sleep(self.delay)


class StandInRequest:
    def __init__(self, prompt_tokens: int, on_chunk):
        self.prompt_tokens, self.on_chunk = prompt_tokens, on_chunk
        self.sent = 0
        self.cancelled = self.done = False

    def cancel(self) -> None:
        self.cancelled = True


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """The status, and the OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code
    return error


class SlowedBatch:
    """A real batching engine, `delay` seconds after each pass, so a test can act while a generation runs."""

    def __init__(self, batch, delay: float):
        self.batch, self.delay = batch, delay
        self.max_batch = batch.max_batch

    @property
    def idle(self) -> bool:
        return self.batch.idle

    def submit(self, *args, **kwargs):
        return self.batch.submit(*args, **kwargs)

    def sweep(self) -> None:
        self.batch.sweep()

    def step(self) -> None:
        self.batch.step()
        time.sleep(self.delay)
