"""Grammar libraries side by side for response_format: set-up per schema and the token mask's time per position.

Each installed library among llguidance, xgrammar and outlines-core builds its tokenizer view, compiles a
five-field JSON schema (and "any JSON object"), then walks a valid 47-token document computing the mask before
every token. Used to pick foretell's grammar library (docs/serving.md).

    .venv/bin/python benchmarks/serve/grammar_masks.py [--tokenizer PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "email", "tags", "address"], "additionalProperties": False}
DOCUMENT = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "poetry", "engines"],
            "address": {"city": "London", "zip": "W1"}}


def seconds(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def report(name: str, setup: dict[str, float], masks: list[float]) -> None:
    parts = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in setup.items())
    print(f"{name}: {parts}; mask mean {statistics.mean(masks) * 1000:.3f} ms, median "
          f"{statistics.median(masks) * 1000:.3f} ms, max {max(masks) * 1000:.2f} ms")


def run_llguidance(tok, ids, vocab: int) -> None:
    import llguidance
    import llguidance.hf

    lltok, t_tok = seconds(lambda: llguidance.hf.from_tokenizer(tok, n_vocab=vocab))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False})
    matcher, t_build = seconds(lambda: llguidance.LLMatcher(lltok, grammar))
    masks = []
    for token in ids:
        masks.append(seconds(matcher.compute_bitmask)[1])
        assert matcher.consume_token(token), matcher.get_error()
    _, t_any = seconds(lambda: llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(
        {"type": "object"})))
    report("llguidance", {"tokenizer": t_tok, "schema": t_build, "any object": t_any}, masks)


def run_xgrammar(tok, ids, vocab: int) -> None:
    import xgrammar

    compiler, t_tok = seconds(lambda: xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(
        tok, vocab_size=vocab)))
    compiled, t_build = seconds(lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                                                     separators=(",", ":")))
    matcher, bitmask, masks = xgrammar.GrammarMatcher(compiled), xgrammar.allocate_token_bitmask(1, vocab), []
    for token in ids:
        masks.append(seconds(lambda: matcher.fill_next_token_bitmask(bitmask))[1])
        assert matcher.accept_token(token)
    _, t_any = seconds(compiler.compile_builtin_json_grammar)
    report("xgrammar", {"tokenizer": t_tok, "schema": t_build, "any object": t_any}, masks)


def byte_vocabulary(tok) -> dict[bytes, list[int]]:
    """A byte-level BPE vocabulary as bytes (GPT-2's printable stand-ins for raw bytes undone)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    stand_in, extra = {}, 0
    for b in range(256):
        if b in printable:
            stand_in[chr(b)] = b
        else:
            stand_in[chr(256 + extra)] = b
            extra += 1
    out: dict[bytes, list[int]] = {}
    for text, token in tok.get_vocab().items():
        if token != tok.eos_token_id and all(c in stand_in for c in text):
            out.setdefault(bytes(stand_in[c] for c in text), []).append(token)
    return out


def run_outlines_core(tok, ids, vocab: int) -> None:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    vocabulary, t_tok = seconds(lambda: Vocabulary(tok.eos_token_id, byte_vocabulary(tok)))
    index, t_build = seconds(lambda: Index(build_regex_from_schema(json.dumps(SCHEMA)), vocabulary))
    guide, mask, masks = Guide(index), torch.zeros((vocab + 31) // 32, dtype=torch.int32), []
    for token in ids:
        masks.append(seconds(lambda: guide.write_mask_into(mask.data_ptr(), mask.numel(), 4))[1])
        guide.advance(token, False)
    _, t_any = seconds(lambda: Index(build_regex_from_schema(json.dumps({"type": "object"})), vocabulary))
    report("outlines-core", {"vocabulary": t_tok, "schema": t_build, "any object": t_any}, masks)


def main() -> None:
    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default=str(Path.home() / ".cache/foretell/presets/smollm2-135m"),
                   help="a Hugging Face tokenizer folder (default: SmolLM2-135M's, as foretell caches it)")
    args = p.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    ids = tok.encode(json.dumps(DOCUMENT, separators=(",", ":")), add_special_tokens=False)
    print(f"tokenizer {args.tokenizer}: {len(tok)} tokens; document {len(ids)} tokens")
    for module, run in (("llguidance", run_llguidance), ("xgrammar", run_xgrammar),
                        ("outlines_core", run_outlines_core)):
        if importlib.util.find_spec(module) is None:
            print(f"{module}: not installed")
            continue
        run(tok, ids, len(tok))


if __name__ == "__main__":
    main()
