"""Helpers for the server tests: a real uvicorn server on a free 127.0.0.1 port, a stand-in engine."""

from __future__ import annotations

import re
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import httpx

from foretell.engine import Chunk, GenerationResult
from foretell.types import GenerationStats


@contextmanager
def running(app):
    """Serve `app` with uvicorn in a background thread; yields its base URL. The socket is bound here, on a
    free port, and handed to uvicorn, so no other process can take the port in between."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


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


class StandInEngine:
    """Replaces the engine where a test needs control over time: each generation waits for `gate`, then
    yields `tokens` one-token chunks `delay` seconds apart. Records how each generation ended."""

    def __init__(self, context_window: int, tokens: int = 100, delay: float = 0.02):
        self.context_window = context_window
        self.tokens, self.delay = tokens, delay
        self.gate = threading.Event()
        self.gate.set()
        self.completed = 0
        self.closed_after: list[int] = []  # chunks sent before a generation was closed early

    def stream(self, prompt_ids: list[int], params):
        assert self.gate.wait(30)
        sent = 0
        try:
            for sent in range(1, self.tokens):
                yield Chunk("w1 ", [4])
                time.sleep(self.delay)
            stats = GenerationStats(prompt_tokens=len(prompt_ids), new_tokens=self.tokens, target_passes=self.tokens,
                                    finish_reason="length")
            self.completed += 1  # the worker closes the generator after the last chunk, as it may
            sent = None
            yield Chunk("w1", [4], GenerationResult([4] * self.tokens, "w1 " * (self.tokens - 1) + "w1", stats))
        except GeneratorExit:
            if sent is not None:
                self.closed_after.append(sent)
            raise


def with_engine(pipeline, engine):
    return replace(pipeline, engine=engine)


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """The status, and the OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code
    return error


class SlowedEngine:
    """The real engine, `delay` seconds between chunks, so a test can act while a generation runs. Closing
    this stream closes the engine's, as the worker's close would."""

    def __init__(self, engine, delay: float):
        self.engine, self.delay = engine, delay
        self.context_window = engine.context_window
        self.chunks_sent: list[int] = []  # per generation, when it ended

    def stream(self, prompt_ids: list[int], params):
        inner, sent = self.engine.stream(prompt_ids, params), 0
        try:
            for chunk in inner:
                yield chunk
                sent += 1
                time.sleep(self.delay)
        finally:
            inner.close()
            self.chunks_sent.append(sent)
