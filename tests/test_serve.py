"""`foretell serve` end to end on the tiny models, through the real `openai` client (sync, async, streaming):
greedy output equals `foretell generate`'s, seeded sampling repeats, usage and the speculative decoding
statistics come with every response, /metrics counts them, and SIGTERM shuts the command down cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra: pip install -e '.[serve]'")
openai = pytest.importorskip("openai", reason="the dev extra: pip install -e '.[dev]'")
import httpx  # noqa: E402

from foretell.api import load  # noqa: E402
from foretell.cli import main  # noqa: E402
from foretell.config import SpeculativeConfig  # noqa: E402
from foretell.serve.app import create_app  # noqa: E402
from foretell.serve.settings import ServeSettings  # noqa: E402
from serve_util import metric, running  # noqa: E402

MODEL = "tiny"
CHAT_PROMPT = "w9 w9 w9 w9"  # its greedy answer runs past 24 tokens and has accepted drafts
RAW_PROMPT = "w5 w6 w7 w5 w6"


@pytest.fixture(scope="module")
def server(tiny_pair):
    target, draft = tiny_pair
    spec = SpeculativeConfig(method="draft-model", model=str(draft), draft_quant="none")
    app = create_app(load(target, spec, dtype="float32", warm_up=False), MODEL, ServeSettings())
    with running(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def generate_cli(tiny_pair, capsys, prompt: str, *extra: str) -> dict:
    """`foretell generate --json` with the server's configuration."""
    target, draft = tiny_pair
    code = main(["generate", prompt, "--model", str(target), "--draft", str(draft), "--draft-quant", "none",
                 "--dtype", "float32", "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def extension(response) -> dict:
    return response.model_extra["speculative_decoding"]


def test_greedy_chat_equals_generate(client, tiny_pair, capsys):
    reference = generate_cli(tiny_pair, capsys, CHAT_PROMPT, "--max-new-tokens", "24")
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": CHAT_PROMPT}],
                                       max_tokens=24, temperature=0)
    assert r.choices[0].message.content == reference["text"]
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == reference["stats"]["finish_reason"] == "length"
    assert r.usage.completion_tokens == len(reference["tokens"]) == 24
    assert r.usage.prompt_tokens == reference["stats"]["prompt_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + 24
    sd = extension(r)
    assert sd["method"] == "draft-model"
    assert sd["target_passes"] == reference["stats"]["target_passes"]
    assert sd["mean_acceptance_length"] == pytest.approx(reference["stats"]["tau"], abs=1e-3)
    assert sd["acceptance_by_position"] == pytest.approx(reference["stats"]["acceptance_per_position"], abs=1e-3)
    # Every target pass adds its accepted drafts and one token of its own.
    assert sd["num_accepted_tokens"] > 0
    assert sd["num_accepted_tokens"] + sd["target_passes"] == r.usage.completion_tokens
    assert sd["num_draft_tokens"] >= sd["num_drafts"] > 0


def test_greedy_completion_equals_generate_no_chat(client, tiny_pair, capsys):
    reference = generate_cli(tiny_pair, capsys, RAW_PROMPT, "--max-new-tokens", "20", "--no-chat")
    r = client.completions.create(model=MODEL, prompt=RAW_PROMPT, max_tokens=20, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == reference["text"]
    assert r.usage.completion_tokens == len(reference["tokens"])
    assert r.usage.prompt_tokens == 5
    assert extension(r)["target_passes"] == reference["stats"]["target_passes"]


def test_stop_string(client, tiny_pair, capsys):
    full = client.completions.create(model=MODEL, prompt=RAW_PROMPT, max_tokens=20, temperature=0).choices[0].text
    stop = full.split()[3]
    reference = generate_cli(tiny_pair, capsys, RAW_PROMPT, "--max-new-tokens", "20", "--no-chat", "--stop", stop)
    r = client.completions.create(model=MODEL, prompt=RAW_PROMPT, max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].text == reference["text"] == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_streaming_chat_equals_the_whole_response(client):
    messages = [{"role": "system", "content": "w3 w4 w5 w6 w7 w8 w3 w4"}, {"role": "user", "content": CHAT_PROMPT}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    closing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(closing) == 1 and closing[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert extension(closing[0]) == extension(whole)
    usage, whole_usage = chunks[-1].usage.model_dump(), whole.usage.model_dump()
    assert chunks[-1].choices == [] and usage.pop("prompt_tokens_details") != whole_usage.pop("prompt_tokens_details")
    assert usage == whole_usage
    # the same prompt again: all of it but its last token came from the prefix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1
    assert all(c.usage is None for c in chunks[:-1])


def test_raw_stream_ends_with_done(server):
    body = {"model": MODEL, "prompt": RAW_PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] == "length" and "usage" not in last
    assert last["speculative_decoding"]["target_passes"] >= 1


def test_async_client_concurrent_streams(server, client):
    """Concurrent requests are decoded in one batch (one target pass verifies all their drafts); each gets what
    it would have got alone."""
    prompts = ["w1 w2 w3", RAW_PROMPT, "w9 w9 w9 w9", "w3 w4"]
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0).choices[0].text
             for p in prompts]

    async def stream(aclient, prompt):
        parts, usage = [], None
        async for chunk in await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                                            stream=True, stream_options={"include_usage": True}):
            parts += [c.text for c in chunk.choices]
            usage = chunk.usage or usage
        return "".join(parts), usage

    async def together():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0) as aclient:
            return await asyncio.gather(*(stream(aclient, p) for p in prompts))

    results = asyncio.run(together())
    assert [text for text, _ in results] == alone
    assert all(usage is not None and usage.completion_tokens >= 1 for _, usage in results)


def test_seeded_sampling_repeats_and_matches_generate(client, tiny_pair, capsys):
    reference = generate_cli(tiny_pair, capsys, CHAT_PROMPT, "--max-new-tokens", "20", "--temperature", "0.9",
                             "--seed", "7")
    ask = dict(model=MODEL, messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=20, temperature=0.9, seed=7)
    first = client.chat.completions.create(**ask).choices[0].message.content
    again = client.chat.completions.create(**ask).choices[0].message.content
    assert first == again == reference["text"]


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    card = client.models.retrieve(MODEL)
    assert card.model_extra["max_model_len"] == 256 and card.model_extra["speculative"]["method"] == "draft-model"
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    counters = {"num_drafts": "foretell:spec_decode_num_drafts_total",
                "num_draft_tokens": "foretell:spec_decode_num_draft_tokens_total",
                "num_accepted_tokens": "foretell:spec_decode_num_accepted_tokens_total"}
    per_position = lambda: [metric(server, "foretell:spec_decode_num_accepted_tokens_per_pos_total",  # noqa: E731
                                   position=str(i)) for i in range(4)]
    before = {k: metric(server, name) for k, name in counters.items()}
    before_pos, tokens = per_position(), metric(server, "foretell:generation_tokens_total")
    done = metric(server, "foretell:request_success_total", finish_reason="length")
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": CHAT_PROMPT}],
                                       max_tokens=24, temperature=0)
    sd = extension(r)
    assert sd["num_accepted_tokens"] > 0
    for key, name in counters.items():
        assert metric(server, name) == before[key] + sd[key], name
    assert sum(per_position()) - sum(before_pos) == sd["num_accepted_tokens"]
    assert metric(server, "foretell:request_success_total", finish_reason="length") == done + 1
    assert metric(server, "foretell:generation_tokens_total") == tokens + 24
    requests = metric(server, "foretell:e2e_request_latency_seconds_count")
    assert requests >= 1 and metric(server, "foretell:time_to_first_token_seconds_count") == requests
    assert metric(server, "foretell:request_queue_time_seconds_count") == requests
    assert metric(server, "foretell:inter_token_latency_seconds_count") > 0
    assert metric(server, "foretell:num_requests_running") == metric(server, "foretell:num_requests_waiting") == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_serve_with_key_then_sigterm(tiny_pair):
    """The command as a user runs it: flags, API key from the environment, then a clean SIGTERM shutdown."""
    target, _ = tiny_pair
    port = free_port()
    env = {**os.environ, "FORETELL_API_KEY": "s3cret"}
    proc = subprocess.Popen([sys.executable, "-m", "foretell.cli", "serve", "--model", str(target), "--drafter",
                             "prompt-lookup", "--dtype", "float32", "--port", str(port), "--served-model-name", MODEL,
                             "--log-level", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "foretell serve did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        keyed = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="s3cret", max_retries=0)
        r = keyed.completions.create(model=MODEL, prompt=RAW_PROMPT, max_tokens=6, temperature=0)
        assert r.usage.completion_tokens == 6 and extension(r)["method"] == "prompt-lookup"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).models.list()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "shut down cleanly" in err and f"http://127.0.0.1:{port}/v1, API key required" in err
