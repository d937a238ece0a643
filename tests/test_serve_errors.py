"""The server's failure paths: every bad request gets its status and an OpenAI-format error and the server
keeps serving; API keys; a full queue (503 + Retry-After); a client that leaves mid-stream has its generation
stopped; the per-request time limit. Timing-sensitive cases use a stand-in engine, never timing asserts."""

from __future__ import annotations

import gc
import json
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra: pip install -e '.[serve]'")
openai = pytest.importorskip("openai", reason="the dev extra: pip install -e '.[dev]'")
import httpx  # noqa: E402

from foretell.api import load  # noqa: E402
from foretell.errors import ForetellError  # noqa: E402
from foretell.serve.app import create_app  # noqa: E402
from foretell.serve.settings import ServeSettings  # noqa: E402
from serve_util import SlowedBatch, StandInBatch, assert_openai_error, metric, running, wait_until  # noqa: E402

MODEL = "tiny"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def pipeline(tiny_pair):
    return load(tiny_pair[0], "prompt-lookup", dtype="float32", warm_up=False)


@pytest.fixture(scope="module")
def server(pipeline):
    with running(create_app(pipeline, MODEL, ServeSettings(max_body_bytes=4096))) as url:
        yield url


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "w5 w6"}], "max_tokens": 4, **fields}


BAD_REQUESTS = {
    "malformed JSON": (CHAT, b'{"model": "tiny", "messages": [', 400, None),
    "not an object": (CHAT, b"[1, 2]", 400, None),
    "no model": (CHAT, json.dumps({"messages": [{"role": "user", "content": "w1"}]}), 400, None),
    "messages not a list": (CHAT, json.dumps(chat(messages="w1 w2")), 400, None),
    "empty messages": (CHAT, json.dumps(chat(messages=[])), 400, None),
    "unknown role": (CHAT, json.dumps(chat(messages=[{"role": "robot", "content": "w1"}])), 400, None),
    "max_tokens a string": (CHAT, json.dumps(chat(max_tokens="ten")), 400, None),
    "max_tokens a float": (CHAT, json.dumps(chat(max_tokens=4.5)), 400, None),
    "temperature a string": (CHAT, json.dumps(chat(temperature="hot")), 400, None),
    "stream a string": (CHAT, json.dumps(chat(stream="yes")), 400, None),
    "negative max_tokens": (CHAT, json.dumps(chat(max_tokens=-1)), 400, None),
    "zero max_tokens": (COMPLETIONS, json.dumps({"model": MODEL, "prompt": "w1", "max_tokens": 0}), 400, None),
    "huge max_tokens": (CHAT, json.dumps(chat(max_tokens=10**12)), 400, "context_length_exceeded"),
    "max_tokens past the window": (COMPLETIONS, json.dumps({"model": MODEL, "prompt": "w1 w2", "max_tokens": 255}),
                                   400, "context_length_exceeded"),
    "temperature above 2": (CHAT, json.dumps(chat(temperature=2.5)), 400, None),
    "negative temperature": (CHAT, json.dumps(chat(temperature=-0.1)), 400, None),
    "top_p zero": (CHAT, json.dumps(chat(top_p=0)), 400, None),
    "top_p above 1": (CHAT, json.dumps(chat(top_p=1.5)), 400, None),
    "negative top_k": (CHAT, json.dumps(chat(top_k=-2)), 400, None),
    "seed out of range": (CHAT, json.dumps(chat(seed=2**70)), 400, None),
    "n = 17": (CHAT, json.dumps(chat(n=17)), 400, None),
    "empty stop string": (CHAT, json.dumps(chat(stop=[""])), 400, None),
    "stream_options without stream": (CHAT, json.dumps(chat(stream_options={"include_usage": True})), 400, None),
    "unknown field": (CHAT, json.dumps(chat(temprature=0.5)), 400, None),
    "penalty out of range": (CHAT, json.dumps(chat(frequency_penalty=2.5)), 400, None),
    "tools": (CHAT, json.dumps(chat(tools=[{"type": "function"}])), 400, None),
    "two prompts": (COMPLETIONS, json.dumps({"model": MODEL, "prompt": ["w1", "w2"]}), 400, None),
    "empty prompt": (COMPLETIONS, json.dumps({"model": MODEL, "prompt": ""}), 400, None),
    "over-long prompt": (COMPLETIONS, json.dumps({"model": MODEL, "prompt": "w5 " * 300}), 400,
                         "context_length_exceeded"),
    "over-long chat": (CHAT, json.dumps(chat(messages=[{"role": "user", "content": "w5 " * 300}])), 400,
                       "context_length_exceeded"),
    "unknown model": (CHAT, json.dumps(chat(model="gpt-4")), 404, "model_not_found"),
    "a path as model": (COMPLETIONS, json.dumps({"model": "/etc/passwd", "prompt": "w1"}), 404, "model_not_found"),
    "oversized body": (COMPLETIONS, json.dumps({"model": MODEL, "prompt": "w1 " * 3000}), 413, "request_too_large"),
}


@pytest.mark.parametrize("path, body, status, code", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_request_gets_its_status_and_the_server_keeps_serving(server, path, body, status, code):
    r = httpx.post(server + path, content=body, headers={"content-type": "application/json"})
    assert_openai_error(r, status, code)
    ok = httpx.post(server + COMPLETIONS, json={"model": MODEL, "prompt": "w5 w6 w7 w5 w6", "max_tokens": 3,
                                                     "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_error_messages_name_the_problem(server):
    r = httpx.post(server + CHAT, json=chat(temperature=2.5))
    assert assert_openai_error(r, 400)["param"] == "temperature"
    r = httpx.post(server + CHAT, json=chat(max_tokens=10**12))
    assert "context window is 256" in assert_openai_error(r, 400)["message"]
    r = httpx.post(server + CHAT, content=b"{oops", headers={"content-type": "application/json"})
    assert "not valid JSON" in assert_openai_error(r, 400)["message"]
    assert "less than or equal to 16" in assert_openai_error(httpx.post(server + CHAT, json=chat(n=17)), 400)["message"]


def said(choice: dict) -> tuple:
    """A response choice's output: its message (chat) or text, and why it ended."""
    return choice.get("message", choice.get("text")), choice["finish_reason"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_null_means_the_default_as_in_openai(server, path):
    """OpenAI's API takes null for every optional field (its SDKs send unset fields so): each one null at once is
    the request without them, e.g. n null = one choice and stream null = one JSON response."""
    from foretell.serve.protocol import ChatCompletionRequest, CompletionRequest

    model = ChatCompletionRequest if path == CHAT else CompletionRequest
    nulls = {f.alias or name: None for name, f in model.model_fields.items() if not f.is_required()}
    assert {"n", "stream", "stream_options", "speculative", "logit_bias", "seed"} <= set(nulls)
    base = (chat() if path == CHAT else {"model": MODEL, "prompt": "w5 w6", "max_tokens": 4}) | {"temperature": 0}
    r = httpx.post(server + path, json={**nulls, **base})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    without = httpx.post(server + path, json=base).json()["choices"]
    assert len(without) == 1 and [said(c) for c in r.json()["choices"]] == [said(c) for c in without]
    options = {"include_usage": None, "continuous_usage_stats": None}
    streamed = httpx.post(server + path, json={**base, "stream": True, "stream_options": options})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert '"usage":{' not in streamed.text.replace(" ", "")  # include_usage null = false


NAMED_FIELDS = {  # checks across fields, and pydantic's own: each 400 names the field in `param`
    "n": (CHAT, chat(n=0)),
    "stream_options": (CHAT, chat(stream_options={"include_usage": True})),
    "stop": (CHAT, chat(stop=[""])),
    "echo": (COMPLETIONS, {"model": MODEL, "prompt": "w1", "echo": True}),
    "tools": (CHAT, chat(tools=[{"type": "function"}])),
    "max_completion_tokens": (CHAT, chat(max_tokens=4, max_completion_tokens=5)),
    "prompt": (COMPLETIONS, {"model": MODEL, "prompt": ["w1", "w2"]}),
    "max_tokens": (CHAT, chat(max_tokens="ten")),
    "messages": (CHAT, chat(messages=[{"role": "robot", "content": "w1"}])),
}


@pytest.mark.parametrize("param, path, body", [(k, *v) for k, v in NAMED_FIELDS.items()], ids=NAMED_FIELDS.keys())
def test_a_400_about_a_field_names_it_in_param(server, param, path, body):
    error = assert_openai_error(httpx.post(server + path, json=body), 400)
    assert error["param"] == param and param in error["message"]


def test_oversized_body_without_content_length(server):
    """A chunked body has no Content-Length: it is counted as it arrives and refused past the limit."""
    chunks = (b'{"model": "tiny", "prompt": "' + b"w1 " * 500 for _ in range(10))
    r = httpx.post(server + COMPLETIONS, content=chunks, headers={"content-type": "application/json"})
    assert_openai_error(r, 413, "request_too_large")


def test_unknown_route_and_method(server):
    assert_openai_error(httpx.get(server + "/v1/nothing"), 404)
    assert_openai_error(httpx.get(server + COMPLETIONS), 405)


def test_openai_client_raises_the_matching_errors(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "w1"}])
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w1"}], top_p=2.0)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_counted_in_metrics(server):
    before = metric(server, "foretell:request_errors_total", status="404")
    httpx.post(server + CHAT, json=chat(model="other"))
    assert metric(server, "foretell:request_errors_total", status="404") == before + 1


def test_api_key(pipeline):
    with running(create_app(pipeline, MODEL, ServeSettings(api_key="k3y"))) as url:
        body = {"model": MODEL, "prompt": "w1 w2", "max_tokens": 2}
        assert_openai_error(httpx.post(url + COMPLETIONS, json=body), 401, "invalid_api_key")
        assert_openai_error(httpx.post(url + COMPLETIONS, json=body, headers={"Authorization": "Bearer nope"}), 401)
        assert_openai_error(httpx.get(url + "/v1/models", headers={"Authorization": "k3y"}), 401)
        assert_openai_error(httpx.get(url + "/v1/models", headers={"Authorization": "Basic k3y"}), 401)
        assert httpx.post(url + COMPLETIONS, json=body, headers={"Authorization": "Bearer k3y"}).status_code == 200
        for scheme in ("bearer", "BEARER", "BeArEr"):  # a scheme is case-insensitive (RFC 9110)
            assert httpx.get(url + "/v1/models", headers={"Authorization": f"{scheme} k3y"}).status_code == 200
        for headers in ({}, {"Authorization": "Bearer nope"}):  # a 401 says which scheme to use (RFC 9110)
            refused = httpx.get(url + "/v1/models", headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer ")
        assert httpx.get(url + "/health").status_code == 200  # probes need no key
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        assert openai.OpenAI(base_url=f"{url}/v1", api_key="k3y", max_retries=0).models.list().data[0].id == MODEL


def test_settings_are_checked():
    for bad in (dict(max_queue=0), dict(request_timeout=0), dict(max_body_bytes=10), dict(api_key="two words"),
                dict(max_batch=0), dict(batch_budget="some"), dict(prefill_chunk=0), dict(shutdown_timeout=-1),
                dict(header_timeout=0), dict(body_timeout=-1), dict(keep_alive_timeout=float("nan")),
                dict(prefix_cache_mb=-1)):
        with pytest.raises(ForetellError):
            ServeSettings(**bad)


def test_full_queue_answers_503_with_retry_after(pipeline):
    engine = StandInBatch(tokens=3, delay=0)
    engine.gate.clear()  # hold the first generation so the queue fills
    body = {"model": MODEL, "prompt": "w1", "max_tokens": 3}
    with running(create_app(pipeline, MODEL, ServeSettings(max_queue=1), batch=engine)) as url, \
            ThreadPoolExecutor(2) as pool:
        running_one = pool.submit(httpx.post, url + COMPLETIONS, json=body, timeout=30)
        wait_until(lambda: metric(url, "foretell:num_requests_running") == 1, what="the first request to run")
        waiting_one = pool.submit(httpx.post, url + COMPLETIONS, json=body, timeout=30)
        wait_until(lambda: metric(url, "foretell:num_requests_waiting") == 1, what="the second request to wait")
        full = httpx.post(url + COMPLETIONS, json=body)
        assert_openai_error(full, 503, "queue_full")
        assert full.headers["retry-after"] == "1"
        engine.gate.set()
        assert running_one.result().status_code == waiting_one.result().status_code == 200
        assert httpx.post(url + COMPLETIONS, json=body).status_code == 200
        assert engine.completed == 3


def test_client_leaving_mid_stream_stops_its_generation(pipeline):
    engine = StandInBatch(tokens=200, delay=0.02)  # 4 s if never stopped
    body = {"model": MODEL, "prompt": "w1", "max_tokens": 200, "stream": True}
    with running(create_app(pipeline, MODEL, ServeSettings(), batch=engine)) as url:
        with httpx.stream("POST", url + COMPLETIONS, json=body) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
        # Leaving the block closed the connection mid-stream.
        wait_until(lambda: engine.closed_after, what="the generation to be closed")
        assert engine.closed_after[0] < 199 and engine.completed == 0
        wait_until(lambda: metric(url, "foretell:request_aborted_total", reason="cancelled") == 1,
                   what="the cancellation to be counted")
        assert metric(url, "foretell:num_requests_running") == 0
        engine.tokens = 3
        assert httpx.post(url + COMPLETIONS, json={**body, "stream": False}).status_code == 200


def test_client_leaving_frees_the_kv_cache(tiny_pair):
    """With the real engine: the request's KV cache is gone once its client has left, long before the
    generation would have ended."""
    pipe = load(tiny_pair[0], "none", dtype="float32", warm_up=False)
    caches, new_cache = [], pipe.engine.target.new_cache

    def tracked(capacity):
        cache = new_cache(capacity)
        caches.append(weakref.ref(cache))
        return cache

    pipe.engine.target.new_cache = tracked
    engine = SlowedBatch(pipe.batch_engine(), delay=0.1)
    body = {"model": MODEL, "prompt": "w5 w6 w7 w5 w6", "max_tokens": 24, "temperature": 0, "stream": True}
    with running(create_app(pipe, MODEL, ServeSettings(), batch=engine)) as url:
        with httpx.stream("POST", url + COMPLETIONS, json=body) as r:
            assert next(line for line in r.iter_lines() if line.startswith("data: "))
        assert len(caches) == 1
        wait_until(lambda: gc.collect() >= 0 and caches[0]() is None, what="the request's KV cache to be freed")
        assert metric(url, "foretell:request_success_total", finish_reason="length") == 0  # it never finished


def test_client_leaving_a_plain_request_stops_its_generation(pipeline):
    engine = StandInBatch(tokens=200, delay=0.02)
    body = {"model": MODEL, "prompt": "w1", "max_tokens": 200}
    with running(create_app(pipeline, MODEL, ServeSettings(), batch=engine)) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + COMPLETIONS, json=body, timeout=httpx.Timeout(5, read=0.3))
        wait_until(lambda: engine.closed_after, what="the generation to be closed")
        assert engine.completed == 0
        wait_until(lambda: metric(url, "foretell:request_aborted_total", reason="cancelled") == 1,
                   what="the cancellation to be counted")


def test_time_limit(pipeline):
    engine = StandInBatch(tokens=200, delay=0.02)
    body = {"model": MODEL, "prompt": "w1", "max_tokens": 200}
    with running(create_app(pipeline, MODEL, ServeSettings(request_timeout=0.3), batch=engine)) as url:
        r = httpx.post(url + COMPLETIONS, json=body)
        assert_openai_error(r, 504, "timeout")
        assert r.headers["x-should-retry"] == "false"  # the OpenAI client would otherwise retry it
        wait_until(lambda: len(engine.closed_after) == 1, what="the generation to be closed")
        with httpx.stream("POST", url + COMPLETIONS, json={**body, "stream": True}) as s:
            events = [line for line in s.iter_lines() if line]
        assert s.status_code == 200 and events[-1] == "data: [DONE]"
        assert json.loads(events[-2][len("data: "):])["error"]["code"] == "timeout"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIError, match="limit of 0.3 s"):
            for _ in client.completions.create(model=MODEL, prompt="w1", max_tokens=200, stream=True):
                pass
        wait_until(lambda: metric(url, "foretell:request_aborted_total", reason="timeout") == 3,
                   what="the three time-outs to be counted")
        assert engine.completed == 0


def test_cli_checks_server_flags_before_loading(tiny_pair, capsys):
    from foretell.cli import main

    model = ["serve", "--model", str(tiny_pair[0]), "--dtype", "float32"]
    assert main([*model, "--max-queue", "0"]) == 2
    assert "--max-queue must be >= 1" in capsys.readouterr().err
    assert main([*model, "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main([*model, "--drafter", "none", "--gamma", "3"]) == 2  # the speculative config is checked as for generate
    assert "gamma" in capsys.readouterr().err
    assert main([*model, "--header-timeout", "0"]) == 2
    assert "--header-timeout must be > 0" in capsys.readouterr().err


def test_serve_help_says_what_the_server_does(capsys):
    from foretell.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exited.value.code == 0
    assert "batches them continuously" in text and "one at a time" not in text
    assert "--header-timeout" in text and "--body-timeout" in text and "--keep-alive-timeout" in text
    assert "error event, then [DONE]" in text


def test_the_model_loads_on_a_thread_that_passes():
    """foretell serve loads its model off the main thread (worker.on_a_passing_thread: the main thread must not
    keep an OpenMP pool beside the engine thread's): the value comes back, the thread had the asked torch
    threads, and an error inside is raised here."""
    import threading

    import torch

    from foretell.errors import ForetellError
    from foretell.serve.worker import on_a_passing_thread

    seen = on_a_passing_thread(lambda: (threading.current_thread() is threading.main_thread(),
                                        torch.get_num_threads()), 1)
    assert seen == (False, 1)

    def fail():
        raise ForetellError("no such model")

    with pytest.raises(ForetellError, match="no such model"):
        on_a_passing_thread(fail, 1)
