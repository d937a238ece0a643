"""Constrained output (response_format) at the engine: the grammar judges drafts per position, so speculative
constrained decoding gives plain constrained decoding's tokens (greedy fp32), and the output is valid JSON."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema", reason="the dev extra: pip install -e '.[dev]'")

from foretell.api import load  # noqa: E402
from foretell.cli import main  # noqa: E402
from foretell.config import SpeculativeConfig  # noqa: E402
from foretell.drafters.base import DrafterBase  # noqa: E402
from foretell.errors import ForetellError  # noqa: E402
from foretell.types import Proposal, ResponseFormat, SamplingParams  # noqa: E402

# Bounded: every valid document is short, so a random model's output ends within max_new_tokens.
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 0, "maximum": 999}, "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 3}},
    "required": ["name", "ok", "n", "color", "tags"], "additionalProperties": False}
FORMAT = ResponseFormat("json_schema", json.dumps(SCHEMA))
PROMPT = [{"role": "user", "content": "a json object"}]


@pytest.fixture(scope="module")
def plain(json_pair):
    return load(json_pair[0], "none", dtype="float32", warm_up=False)


def spec(plain, json_pair, method: str):
    options = {"draft-model": dict(model=str(json_pair[1]), draft_quant="none", gamma=4),
               "draft-tree": dict(model=str(json_pair[1]), draft_quant="none"), "prompt-lookup": dict(gamma=4)}
    return plain.with_speculative(SpeculativeConfig(method=method, **options[method]))


def valid(text: str) -> dict:
    document = json.loads(text)
    jsonschema.validate(document, SCHEMA)
    return document


@pytest.mark.parametrize("method", ["draft-model", "draft-tree", "prompt-lookup"])
def test_greedy_constrained_speculation_equals_plain(plain, json_pair, method):
    pipe = spec(plain, json_pair, method)
    want = plain.generate(PROMPT, max_new_tokens=150, response_format=FORMAT)
    got = pipe.generate(PROMPT, max_new_tokens=150, response_format=FORMAT)
    assert got.tokens == want.tokens and got.stats.finish_reason == "stop"
    valid(got.text)
    if method != "prompt-lookup":  # the drafters draft without the grammar: their allowed drafts are verified
        assert got.stats.draft_tokens_verified > 0


def test_sampled_constrained_output_is_always_valid(plain, json_pair):
    pipe = spec(plain, json_pair, "draft-tree")
    verified = 0
    for seed in range(8):
        result = pipe.generate(PROMPT, max_new_tokens=150, temperature=1.0, seed=seed, response_format=FORMAT)
        assert result.stats.finish_reason == "stop"
        valid(result.text)
        verified += result.stats.draft_tokens_verified
    assert verified > 0
    free = pipe.generate(PROMPT, max_new_tokens=40, temperature=1.0, seed=0)  # the model alone writes no JSON
    with pytest.raises(ValueError):
        json.loads(free.text)


def test_json_object(plain, json_pair):
    pipe = spec(plain, json_pair, "draft-model")
    fmt = ResponseFormat("json_object")
    ended = 0
    for seed in range(4):
        result = pipe.generate(PROMPT, max_new_tokens=200, temperature=0.7, seed=seed, response_format=fmt)
        if result.stats.finish_reason == "stop":
            assert isinstance(json.loads(result.text), dict)
            ended += 1
        else:  # cut by the token limit: still an object's beginning
            assert result.text.startswith("{")
    assert ended > 0


class ForbiddenDrafter(DrafterBase):
    """Proposes one token again and again."""

    name = "forbidden"

    def __init__(self, token: int):
        self.token = token

    def start(self, prompt_ids, capacity, params, generator) -> None:
        pass

    def propose(self, tokens, max_tokens) -> Proposal:
        return Proposal(torch.full((max_tokens,), self.token, dtype=torch.long))


def test_drafts_the_grammar_forbids_never_reach_the_target(plain):
    """A control character is valid nowhere in JSON (not even inside a string, unescaped): its drafts are dropped
    before the target pass, and the output is plain decoding's."""
    [control] = plain.tokenizer.encode("\x01", add_special_tokens=False)
    want = plain.generate(PROMPT, max_new_tokens=150, response_format=FORMAT)
    got = plain.with_drafter(ForbiddenDrafter(control), gamma=3).generate(PROMPT, max_new_tokens=150,
                                                                          response_format=FORMAT)
    assert got.tokens == want.tokens
    assert got.stats.draft_tokens_verified == 0
    free = plain.with_drafter(ForbiddenDrafter(control), gamma=3).generate(PROMPT, max_new_tokens=10)
    assert free.stats.draft_tokens_verified > 0  # without a grammar the same drafts are verified


def test_grammar_rows_follow_each_tree_path(plain):
    """allowed_rows for a tree = the masks of a fresh matcher fed each node's path; a forbidden node and its
    subtree are dropped by allowed_nodes."""
    compiler = plain.engine.grammar_compiler()
    grammar = compiler.matcher(FORMAT)
    ids = plain.tokenizer.encode('{"name":"ab"', add_special_tokens=False)
    brace = plain.tokenizer.convert_tokens_to_ids("{")
    # root -> ids[0] -> ids[1]; root -> ids[0] -> "{" (forbidden) -> ids[2]; root -> "{"
    tree = Proposal(torch.tensor([ids[0], ids[1], brace, ids[2], brace]), parents=torch.tensor([-1, 0, 0, 2, -1]))
    assert grammar.allowed_nodes(tree) == [0, 1, 4]
    kept = Proposal(torch.tensor([ids[0], ids[1], brace]), parents=torch.tensor([-1, 0, -1]))
    rows = grammar.allowed_rows(kept, 4, plain.engine.target.config.vocab_size)
    for row, path in zip(rows, ([], [ids[0]], [ids[0], ids[1]], [brace])):
        fresh = compiler.matcher(FORMAT)
        fresh.commit(path)
        assert torch.equal(row, fresh._mask())
    assert torch.equal(rows[0], grammar._mask())  # the matcher is back at the committed tokens


def test_batch_with_and_without_grammars_equals_alone(plain, json_pair):
    pipe = spec(plain, json_pair, "draft-model")
    params = [SamplingParams(max_new_tokens=120, response_format=FORMAT),
              SamplingParams(max_new_tokens=30, ignore_eos=True),
              SamplingParams(max_new_tokens=120, response_format=ResponseFormat("json_object"), presence_penalty=0.5),
              SamplingParams(max_new_tokens=120, response_format=FORMAT, logit_bias={5: 2.0})]
    prompts = [plain.encode(PROMPT), [1, 40, 41, 42], plain.encode([{"role": "user", "content": "obj"}]), [1, 7]]
    alone = [plain.engine.generate(p, s).tokens for p, s in zip(prompts, params)]
    batch = pipe.batch_engine(max_batch=4)
    results = [None] * 4
    for i, (p, s) in enumerate(zip(prompts, params)):
        batch.submit(p, s, lambda c, i=i: c.result and results.__setitem__(i, c.result), pytest.fail)
    batch.run()
    assert [r.tokens for r in results] == alone
    valid(results[0].text)


def test_a_schema_the_grammar_refuses_is_named(plain):
    bad = ResponseFormat("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "strin"}}}))
    with pytest.raises(ForetellError, match="strin"):
        plain.generate(PROMPT, max_new_tokens=5, response_format=bad)


def test_cli_json_schema(json_pair, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    code = main(["generate", "a json object", "--model", str(json_pair[0]), "--draft", str(json_pair[1]),
                 "--draft-quant", "none", "--dtype", "float32", "--json", "--json-schema", str(schema),
                 "--max-new-tokens", "150"])
    assert code == 0
    valid(json.loads(capsys.readouterr().out)["text"])
