"""The HTTP surface around the routes: the generation endpoints take only JSON bodies (415), connections that
never finish their headers and idle keep-alive connections are closed, and a shutdown answers the requests that
outlive --shutdown-timeout with an error (a JSON 503, or an error event and [DONE] in a stream) instead of
cutting them, without a traceback in the log. Timeouts are set short and only closing is asserted."""

from __future__ import annotations

import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra: pip install -e '.[serve]'")
import httpx  # noqa: E402

from foretell.api import load  # noqa: E402
from foretell.serve.app import create_app  # noqa: E402
from foretell.serve.settings import ServeSettings  # noqa: E402
from serve_util import StandInBatch, assert_openai_error, metric, serving, wait_until  # noqa: E402

MODEL = "tiny"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROMPT = {"model": MODEL, "prompt": "w1", "max_tokens": 2}


@pytest.fixture(scope="module")
def pipeline(tiny_pair):
    return load(tiny_pair[0], "prompt-lookup", dtype="float32", warm_up=False)


@pytest.fixture
def server_log():
    """Every record uvicorn and foretell log while the test runs (uvicorn's loggers do not reach the root)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "foretell")]
    for logger in loggers:
        logger.addHandler(handler)
    yield records
    for logger in loggers:
        logger.removeHandler(handler)


def no_traceback_in(records: list[logging.LogRecord]) -> None:
    for r in records:
        assert r.exc_info is None and "Exception in ASGI" not in r.getMessage(), r.getMessage()
        assert "Cancel" not in r.getMessage(), r.getMessage()  # uvicorn's backstop: "Cancel N running task(s)"


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes the connection (reading past any response first) within the socket's timeout."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def read_response(sock: socket.socket, ends_with: bytes) -> bytes:
    data = b""
    while not data.endswith(ends_with):
        part = sock.recv(65536)
        assert part, f"the connection closed after {data!r}"
        data += part
    return data


HEALTH = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
HEALTHY = b'{"status":"ok"}'


def test_generation_endpoints_take_only_json(pipeline):
    """A browser sends a cross-site POST without a preflight only with a form or text/plain body: refused."""
    body = json.dumps(PROMPT)
    with serving(create_app(pipeline, MODEL, ServeSettings())) as (_, url):
        for declared in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b",
                         "application/jsonx", "application/json; charset=latin-1"):
            for path in (COMPLETIONS, CHAT):
                headers = {"origin": "https://elsewhere.example"} | ({"content-type": declared} if declared else {})
                error = assert_openai_error(httpx.post(url + path, content=body, headers=headers), 415,
                                            "unsupported_media_type")
                assert "Content-Type: application/json" in error["message"]
        assert metric(url, "foretell:e2e_request_latency_seconds_count") == 0  # none of them was generated
        for declared in ("application/json", "Application/JSON; charset=UTF-8", 'application/json;charset="utf-8"'):
            assert httpx.post(url + COMPLETIONS, content=body, headers={"content-type": declared}).status_code == 200
        preflight = httpx.options(url + COMPLETIONS, headers={"origin": "https://elsewhere.example",
                                                              "access-control-request-method": "POST",
                                                              "access-control-request-headers": "content-type"})
        assert preflight.status_code >= 400 and "access-control-allow-origin" not in preflight.headers


def test_header_timeout_closes_connections_that_never_finish_their_headers(pipeline):
    engine = StandInBatch(tokens=60, delay=0.02)  # a generation longer than the header timeout
    settings = ServeSettings(header_timeout=0.5, keep_alive_timeout=60)  # only the header timeout can close
    with serving(create_app(pipeline, MODEL, settings, batch=engine)) as (_, url):
        silent = connect(url)
        partial = connect(url)
        partial.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: appl")
        later = connect(url)  # a second request on a kept-alive connection that stops mid-headers
        later.sendall(HEALTH)
        read_response(later, HEALTHY)
        later.sendall(b"GET /health HTTP/1.1\r\nHo")
        assert closed_by_server(silent) and closed_by_server(partial) and closed_by_server(later)
        # A request whose headers came in time is never cut by the header timeout, however long it takes.
        r = httpx.post(url + COMPLETIONS, json={**PROMPT, "max_tokens": 60})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 60
        for sock in (silent, partial, later):
            sock.close()


def test_body_timeout_answers_a_body_that_trickles_in_and_closes_it(pipeline):
    """A request whose head came whole but whose body comes a byte at a time is answered 408 and closed once
    --body-timeout has passed, however steadily the bytes keep coming (the header timeout no longer applies)."""
    settings = ServeSettings(body_timeout=0.5, header_timeout=60, keep_alive_timeout=60)  # only the body's can act
    with serving(create_app(pipeline, MODEL, settings)) as (_, url), connect(url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 200\r\n\r\n")
        sock.settimeout(0.1)
        started, answer = time.monotonic(), b""
        while time.monotonic() - started < 10:  # 200 bytes at 0.1 s each would take 20 s
            try:
                sock.sendall(b" ")
                part = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not part:
                break
            answer += part
        took = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer, answer
        assert b"connection: close" in answer.lower() and took < 5
        sock.settimeout(5)
        assert closed_by_server(sock)
        assert httpx.get(url + "/health").status_code == 200


def test_keep_alive_timeout_closes_idle_connections(pipeline):
    settings = ServeSettings(keep_alive_timeout=0.5, header_timeout=60)  # only the keep-alive timeout can close
    with serving(create_app(pipeline, MODEL, settings)) as (_, url), connect(url) as sock:
        for _ in range(2):  # the connection is reused while requests keep coming
            sock.sendall(HEALTH)
            assert read_response(sock, HEALTHY).startswith(b"HTTP/1.1 200")
        assert closed_by_server(sock)


def stream_lines(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url + COMPLETIONS, json=body, timeout=60) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def test_shutdown_answers_requests_past_the_timeout_with_an_error(pipeline, server_log):
    """One request streaming and one waiting for the engine when the server is told to stop: past the shutdown
    timeout the stream gets an error event and [DONE], the other a JSON 503, and the exit message counts them."""
    engine = StandInBatch(tokens=100_000, delay=0.01)  # a generation that would outlast any test
    body = {**PROMPT, "max_tokens": 200}  # the stand-in engine ignores it
    with serving(create_app(pipeline, MODEL, ServeSettings(shutdown_timeout=0.5), batch=engine)) as (server, url), \
            ThreadPoolExecutor(2) as pool:
        streamed = pool.submit(stream_lines, url, {**body, "stream": True})
        wait_until(lambda: metric(url, "foretell:num_requests_running") == 1, what="the stream to run")
        waiting = pool.submit(httpx.post, url + COMPLETIONS, json=body, timeout=60)
        wait_until(lambda: metric(url, "foretell:num_requests_waiting") == 1, what="the second request to wait")
        server.should_exit = True  # what SIGTERM does
        events, answer = streamed.result(timeout=60), waiting.result(timeout=60)
    assert len(events) > 2 and all(json.loads(e[6:])["choices"][0]["text"] for e in events[:-2])
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["error"]["code"] == "shutting_down"
    assert_openai_error(answer, 503, "shutting_down")
    assert server.exit_message().startswith("shut down after --shutdown-timeout (0.5 s): 2 request(s)")
    assert server.closed == 0 and engine.completed == 0
    no_traceback_in(server_log)


def test_shutdown_lets_requests_finish_within_the_timeout(pipeline, server_log):
    engine = StandInBatch(tokens=40, delay=0.02)
    with serving(create_app(pipeline, MODEL, ServeSettings(shutdown_timeout=60), batch=engine)) as (server, url), \
            ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(stream_lines, url, {**PROMPT, "max_tokens": 40, "stream": True})
        wait_until(lambda: metric(url, "foretell:num_requests_running") == 1, what="the stream to run")
        server.should_exit = True
        events = streamed.result(timeout=60)
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert engine.completed == 1 and server.exit_message() == "shut down cleanly"
    no_traceback_in(server_log)


def test_shutdown_closes_a_connection_whose_body_never_comes(pipeline, server_log):
    """A request still sending its body is not in the engine: past the timeout and a grace, its connection is
    closed, and the exit message says so."""
    with serving(create_app(pipeline, MODEL, ServeSettings(shutdown_timeout=0.2))) as (server, url), \
            connect(url) as sock:
        server.ending_grace = 0.3
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\": ")
        wait_until(lambda: len(server.server_state.tasks) == 1, what="the request to start")
        server.should_exit = True
        assert closed_by_server(sock)
    assert server.closed == 1 and "1 connection(s) were closed" in server.exit_message()
    no_traceback_in(server_log)
