"""The OpenAI sampling parameters under speculation, through the real `openai` client against `foretell serve` on
the tiny models: logprobs equal plain decoding's, penalties and logit_bias change the output exactly as they do
in plain decoding (greedy fp32, a draft model drafting), n choices, per-request speculation off, json_schema
output valid every time; and at the engine, the same for trees and batches."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra: pip install -e '.[serve]'")
openai = pytest.importorskip("openai", reason="the dev extra: pip install -e '.[dev]'")

from conftest import PROMPTS  # noqa: E402
from foretell.api import load  # noqa: E402
from foretell.config import SpeculativeConfig  # noqa: E402
from foretell.serve.app import create_app  # noqa: E402
from foretell.serve.settings import ServeSettings  # noqa: E402
from foretell.types import SamplingParams  # noqa: E402
from serve_util import assert_openai_error, running  # noqa: E402

MODEL = "tiny"
CHAT_PROMPT = "w9 w9 w9 w9"  # its greedy answer has accepted drafts (test_serve.py)
RAW_PROMPT = "w5 w6 w7 w5 w6"
PENALTIES = {
    "presence and frequency": dict(presence_penalty=1.5, frequency_penalty=0.7),
    "repetition": dict(repetition_penalty=1.8),
    "logit_bias": dict(logit_bias={"9": 4.0, "15": -100.0}),
}


@pytest.fixture(scope="module")
def pipeline(tiny_pair):
    target, draft = tiny_pair
    spec = SpeculativeConfig(method="draft-model", model=str(draft), draft_quant="none", gamma=3)
    return load(target, spec, dtype="float32", warm_up=False)


@pytest.fixture(scope="module")
def server(pipeline):
    with running(create_app(pipeline, MODEL, ServeSettings())) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def extension(response) -> dict:
    return response.model_extra["speculative_decoding"]


def chat_messages(prompt: str = CHAT_PROMPT) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def engine_kwargs(params: dict) -> dict:
    """An OpenAI request's penalties as SamplingParams' fields (logit_bias keys are token ids)."""
    out = dict(params)
    if "logit_bias" in out:
        out["logit_bias"] = {int(k): v for k, v in out["logit_bias"].items()}
    return out


def assert_logprobs_equal(content, reference, tokenizer, top: int) -> None:
    """OpenAI's chat logprobs `content` against plain decoding's TokenLogprobs."""
    assert [c.token for c in content] == [tokenizer.decode([r.token]) for r in reference]
    for c, r in zip(content, reference):
        assert c.logprob == pytest.approx(r.logprob, abs=1e-4)
        assert c.bytes == list(c.token.encode())
        assert [t.token for t in c.top_logprobs] == [tokenizer.decode([t]) for t, _ in r.top]
        assert [t.logprob for t in c.top_logprobs] == pytest.approx([v for _, v in r.top], abs=1e-4)
        assert len(c.top_logprobs) == top


# --- logprobs --------------------------------------------------------------------------------------------------


def test_chat_logprobs_equal_plain_decoding(client, plain):
    reference = plain.generate(chat_messages(), max_new_tokens=20, logprobs=True, top_logprobs=3)
    ask = dict(model=MODEL, messages=chat_messages(), max_tokens=20, temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**ask)
    assert r.choices[0].message.content == reference.text
    assert extension(r)["num_accepted_tokens"] > 0  # the tokens came through verified drafts
    assert_logprobs_equal(r.choices[0].logprobs.content, reference.logprobs, plain.tokenizer, 3)
    # Greedy: the chosen token is the most likely one.
    assert all(c.token == c.top_logprobs[0].token for c in r.choices[0].logprobs.content)
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [c for chunk in chunks for choice in chunk.choices if choice.logprobs for c in choice.logprobs.content]
    assert_logprobs_equal(streamed, reference.logprobs, plain.tokenizer, 3)


def test_completion_logprobs_equal_plain_decoding(client, plain):
    reference = plain.generate(RAW_PROMPT, chat=False, max_new_tokens=12, logprobs=True, top_logprobs=2)
    ask = dict(model=MODEL, prompt=RAW_PROMPT, max_tokens=12, temperature=0, logprobs=2)
    r = client.completions.create(**ask)
    lp = r.choices[0].logprobs
    assert lp.tokens == [plain.tokenizer.decode([x.token]) for x in reference.logprobs]
    assert lp.token_logprobs == pytest.approx([x.logprob for x in reference.logprobs], abs=1e-4)
    for top, x in zip(lp.top_logprobs, reference.logprobs):
        assert list(top) == [plain.tokenizer.decode([t]) for t, _ in x.top]
        assert list(top.values()) == pytest.approx([v for _, v in x.top], abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    streamed = [c.choices[0].logprobs for c in client.completions.create(**ask, stream=True)
                if c.choices and c.choices[0].logprobs]
    assert sum((s.tokens for s in streamed), []) == lp.tokens
    assert sum((s.token_logprobs for s in streamed), []) == pytest.approx(lp.token_logprobs, abs=1e-4)
    assert sum((s.text_offset for s in streamed), []) == lp.text_offset


def test_sampled_logprobs_are_the_targets_over_the_whole_sequence(pipeline, plain, tiny_pair):
    """Sampled at T=0.8 through a draft model and a draft tree: each token's logprob is the target's log-softmax at
    that position, as one forward over prompt + output gives it (the logits before temperature)."""
    tree = pipeline.with_speculative(SpeculativeConfig(method="draft-tree", model=str(tiny_pair[1]),
                                                       draft_quant="none"))
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=3, max_new_tokens=30, ignore_eos=True, logprobs=True,
                            top_logprobs=2, presence_penalty=0.4)
    for spec in (pipeline, tree):
        result = spec.engine.generate(PROMPTS[0], params)
        assert result.stats.draft_tokens_verified > 0
        ids = PROMPTS[0] + result.tokens
        with torch.inference_mode():
            logits = plain.target.model(torch.tensor(ids[:-1]), torch.arange(len(ids) - 1),
                                        plain.target.model.new_cache(len(ids))).logits.float()
        rows = logits[len(PROMPTS[0]) - 1:].clone()  # a normal tensor, changed below
        counts = torch.zeros(rows.shape[-1])
        for i, token in enumerate(result.tokens):  # presence: each token already generated, once
            rows[i] -= 0.4 * (counts > 0).float()
            counts[token] += 1
        expected = torch.log_softmax(rows, -1)[torch.arange(len(result.tokens)), torch.tensor(result.tokens)]
        assert [lp.logprob for lp in result.logprobs] == pytest.approx(expected.tolist(), abs=1e-4)


# --- penalties and logit_bias ---------------------------------------------------------------------------------


@pytest.mark.parametrize("penalty", PENALTIES.values(), ids=PENALTIES.keys())
def test_penalties_change_output_as_in_plain_decoding(client, plain, penalty):
    ask = dict(model=MODEL, messages=chat_messages(), max_tokens=24, temperature=0)
    free = client.chat.completions.create(**ask)
    native = {k: v for k, v in penalty.items() if k != "repetition_penalty"}  # vLLM's extension: in the body
    r = client.chat.completions.create(**ask, **native, extra_body={k: v for k, v in penalty.items() if k not in native})
    reference = plain.generate(chat_messages(), max_new_tokens=24, **engine_kwargs(penalty))
    assert r.choices[0].message.content == reference.text
    assert r.choices[0].message.content != free.choices[0].message.content  # the penalty did something
    assert extension(r)["num_draft_tokens"] > 0


@pytest.mark.parametrize("method", ["draft-model", "draft-tree", "prompt-lookup"])
def test_penalties_under_trees_and_batches_equal_plain(pipeline, plain, tiny_pair, method):
    """Chains and trees, alone and in a batch of 4 with other requests (different penalties each): plain's tokens."""
    options = {"draft-model": dict(model=str(tiny_pair[1]), draft_quant="none", gamma=3),
               "draft-tree": dict(model=str(tiny_pair[1]), draft_quant="none"), "prompt-lookup": dict(gamma=3)}
    spec = pipeline.with_speculative(SpeculativeConfig(method=method, **options[method]))
    settings = [dict(presence_penalty=0.8, frequency_penalty=0.5), dict(repetition_penalty=1.5),
                dict(logit_bias={9: 3.0, 12: -2.0}, frequency_penalty=-0.3), {}]
    params = [SamplingParams(max_new_tokens=30, ignore_eos=True, logprobs=True, **s) for s in settings]
    expected = [plain.engine.generate(p, s) for p, s in zip(PROMPTS, params)]
    verified = 0
    for prompt, s, want in zip(PROMPTS, params, expected):
        got = spec.engine.generate(prompt, s)
        assert got.tokens == want.tokens
        verified += got.stats.draft_tokens_verified
    assert verified > 0
    batch = spec.batch_engine(max_batch=4)
    results = [None] * 4
    for i, (prompt, s) in enumerate(zip(PROMPTS, params)):
        batch.submit(prompt, s, lambda c, i=i: c.result and results.__setitem__(i, c.result), pytest.fail)
    batch.run()
    assert [r.tokens for r in results] == [w.tokens for w in expected]
    for r, w in zip(results, expected):
        assert [x.logprob for x in r.logprobs] == pytest.approx([x.logprob for x in w.logprobs], abs=1e-4)


# --- n, speculation off ---------------------------------------------------------------------------------------


def test_n_choices(client):
    ask = dict(model=MODEL, messages=chat_messages(), max_tokens=12, temperature=1.0, seed=11, n=3,
               logit_bias={"2": -100})  # no end-of-sequence token: every choice runs to its 12 tokens
    r = client.chat.completions.create(**ask)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1  # independent samples
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 3 * 12
    assert extension(r)["target_passes"] >= 12
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    streamed = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(3)}
    assert set(streamed) == {0, 1, 2} and all(streamed.values())
    assert sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason) == [0, 1, 2]
    assert chunks[-1].usage.completion_tokens == 3 * 12
    completions = client.completions.create(model=MODEL, prompt=RAW_PROMPT, max_tokens=5, temperature=1.0, n=3)
    assert [c.index for c in completions.choices] == [0, 1, 2]


def test_speculation_off_per_request(client, plain):
    ask = dict(model=MODEL, messages=chat_messages(), max_tokens=20, temperature=0)
    on = client.chat.completions.create(**ask)
    off = client.chat.completions.create(**ask, extra_body={"speculative": False})
    assert extension(on)["num_draft_tokens"] > 0 and extension(on)["method"] == "draft-model"
    sd = extension(off)
    assert sd["method"] == "none" and sd["num_draft_tokens"] == sd["num_drafts"] == sd["num_accepted_tokens"] == 0
    assert sd["target_passes"] == 20
    assert off.choices[0].message.content == on.choices[0].message.content
    streamed = list(client.completions.create(model=MODEL, prompt=RAW_PROMPT, max_tokens=6, temperature=0,
                                              stream=True, extra_body={"speculative": False}))
    assert [extension(c)["num_draft_tokens"] for c in streamed if c.choices[0].finish_reason] == [0]


def test_python_api_speculation_off(pipeline):
    on = pipeline.generate(CHAT_PROMPT, max_new_tokens=16)
    off = pipeline.generate(CHAT_PROMPT, max_new_tokens=16, speculative=False)
    assert off.tokens == on.tokens and on.stats.draft_tokens_verified > 0
    assert off.stats.draft_tokens_verified == 0 and off.stats.target_passes == 16


# --- refusals -------------------------------------------------------------------------------------------------

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
BAD = [  # (what is wrong, route, fields): the field named first is the one the 400 must name
    ("bias key not a token id", CHAT, {"logit_bias": {"w5": 2}}),
    ("bias key a superscript digit", CHAT, {"logit_bias": {"\u00b2": 5}}),  # str.isdigit takes it, int() does not
    ("bias key in Arabic-Indic digits", COMPLETIONS, {"logit_bias": {"\u0663": 1}}),
    ("bias key past int()'s digit limit", CHAT, {"logit_bias": {"9" * 5000: 1}}),
    ("bias above 100", CHAT, {"logit_bias": {"5": 101}}),
    ("bias token past the vocabulary", CHAT, {"logit_bias": {"48": 1}}),
    ("presence penalty above 2", CHAT, {"presence_penalty": 2.5}),
    ("repetition penalty 0", CHAT, {"repetition_penalty": 0}),
    ("top_logprobs without logprobs", CHAT, {"top_logprobs": 2}),
    ("top_logprobs above 20", CHAT, {"top_logprobs": 21, "logprobs": True}),
    ("completion logprobs above 20", COMPLETIONS, {"logprobs": 21}),
    ("n 0", CHAT, {"n": 0}),
    ("speculative a string", CHAT, {"speculative": "no"}),
    ("unknown response format", CHAT, {"response_format": {"type": "xml"}}),
    ("json_schema without a schema", CHAT, {"response_format": {"type": "json_schema"}}),
]


@pytest.mark.parametrize("path, fields", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_invalid_parameters_get_a_400_naming_the_field(server, path, fields):
    body = {"model": MODEL, "max_tokens": 4, **fields}
    body.update({"messages": chat_messages()} if path == CHAT else {"prompt": RAW_PROMPT})
    error = assert_openai_error(httpx.post(server + path, json=body), 400)
    param = next(iter(fields))
    assert error["param"] == param and param in error["message"]


# --- response_format ------------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {  # bounded, so a random model's documents end within max_tokens
    "name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 0, "maximum": 999}, "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 3}},
    "required": ["name", "ok", "n", "color", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def json_client(json_pair):
    target, draft = json_pair
    spec = SpeculativeConfig(method="draft-model", model=str(draft), draft_quant="none", gamma=4)
    with running(create_app(load(target, spec, dtype="float32", warm_up=False), MODEL, ServeSettings())) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0), url


def test_json_schema_output_is_valid_every_time(json_client):
    jsonschema = pytest.importorskip("jsonschema", reason="the dev extra: pip install -e '.[dev]'")
    client, _ = json_client
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    drafts = 0
    for seed in range(20):
        r = client.chat.completions.create(model=MODEL, messages=chat_messages("a json object"), max_tokens=150,
                                           temperature=1.0, seed=seed, response_format=fmt)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        drafts += extension(r)["num_draft_tokens"]
    assert drafts > 0  # drafts the grammar allows were verified
    chunks = client.chat.completions.create(model=MODEL, messages=chat_messages("a json object"), max_tokens=150,
                                            temperature=0, response_format=fmt, stream=True)
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), SCHEMA)
    obj = client.chat.completions.create(model=MODEL, messages=chat_messages("a json object"), max_tokens=150,
                                         temperature=0, response_format={"type": "json_object"})
    assert obj.choices[0].message.content.startswith("{")


def test_a_schema_the_grammar_refuses_gets_a_400(json_client):
    _, url = json_client
    body = {"model": MODEL, "messages": chat_messages(), "max_tokens": 4, "response_format": {
        "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "properties": {
            "a": {"type": "strin"}}}}}}
    error = assert_openai_error(httpx.post(url + "/v1/chat/completions", json=body), 400)
    assert error["param"] == "response_format" and "strin" in error["message"]


def test_cli_generate_penalties_and_logprobs(tiny_pair, capsys):
    """foretell generate with penalties, a bias and logprobs: with a draft model, what --drafter none gives."""
    from foretell.cli import main

    target, draft = tiny_pair
    common = ["generate", CHAT_PROMPT, "--model", str(target), "--dtype", "float32", "--json", "--max-new-tokens", "16",
              "--presence-penalty", "1", "--repetition-penalty", "1.3", "--logit-bias", "9=3", "--logprobs", "2"]
    outs = []
    for drafter in (["--draft", str(draft), "--draft-quant", "none"], ["--drafter", "none"]):
        assert main([*common, *drafter]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    spec, off = outs
    assert spec["tokens"] == off["tokens"] and spec["stats"]["draft_passes"] > 0 and off["stats"]["draft_passes"] == 0
    assert [lp["token"] for lp in spec["logprobs"]] == spec["tokens"]
    assert [lp["logprob"] for lp in spec["logprobs"]] == pytest.approx([lp["logprob"] for lp in off["logprobs"]],
                                                                      abs=1e-4)
    assert all(len(lp["top"]) == 2 for lp in spec["logprobs"])
    assert main([*common[:-2], "--logit-bias", "nine=3"]) == 2
    assert "TOKEN=BIAS" in capsys.readouterr().err
