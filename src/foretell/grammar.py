"""Constrained output (response_format json_object / json_schema) through llguidance.

llguidance was picked over xgrammar and outlines-core (docs/serving.md has the measurements): it has no
dependencies and needs no compile step per schema (a matcher in milliseconds, where outlines-core builds an index
over the vocabulary for seconds, and up to a minute or more for "any JSON object"), and its masks take well under
a millisecond on a 49K vocabulary; xgrammar's are faster still, but it requires triton, hundreds of MB that a
CPU engine never uses.

Per request a Grammar follows the committed tokens. Under speculation it also judges drafts: a draft node whose
path the grammar rejects is dropped before the target pass (it could never be accepted), and the target's logits
at every verified position are masked by the grammar's state after that position's own path, so verification
chooses exactly what plain constrained decoding would.
"""

from __future__ import annotations

import threading

import torch

from foretell.errors import ForetellError
from foretell.tree import path_to
from foretell.types import Proposal, ResponseFormat

# Compact JSON (no whitespace between tokens): a small model cannot loop on blank space, and the output is what
# json.dumps writes with separators (",", ":"). A schema's own "x-guidance" options override it.
JSON_OPTIONS = {"whitespace_flexible": False}
ANY_OBJECT = '{"type": "object"}'


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError:
        raise ForetellError("response_format needs llguidance, one of foretell's dependencies: pip install "
                            "llguidance==1.9.1") from None
    return llguidance


class GrammarCompiler:
    """One tokenizer's grammar set-up: its llguidance tokenizer (built once: seconds for a large
    vocabulary) and the grammars made so far, by response format."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: set[int]):
        llg = _llguidance()
        self.vocab_size = vocab_size
        eos = sorted(t for t in stop_ids if t < vocab_size) or None
        try:
            self.tokenizer = llg.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
        except ValueError as e:
            raise ForetellError(f"response_format needs a fast (Rust) Hugging Face tokenizer: {e}") from None
        self._grammars: dict[ResponseFormat, str] = {}
        self._lock = threading.Lock()

    def grammar(self, fmt: ResponseFormat) -> str:
        """The format's grammar, checked; a ForetellError naming the problem when the schema is refused."""
        with self._lock:
            if fmt in self._grammars:
                return self._grammars[fmt]
        llg = _llguidance()
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(fmt.schema or ANY_OBJECT, defaults=JSON_OPTIONS)
        except ValueError as e:
            raise ForetellError(f"response_format: the JSON schema is not valid: {e}") from None
        error = llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise ForetellError(f"response_format: this JSON schema cannot be enforced: {error}")
        with self._lock:
            self._grammars[fmt] = grammar
        return grammar

    def matcher(self, fmt: ResponseFormat) -> Grammar:
        llg = _llguidance()
        matcher = llg.LLMatcher(self.tokenizer, self.grammar(fmt))
        if matcher.is_error():
            raise ForetellError(f"response_format: {matcher.get_error()}")
        return Grammar(matcher, self.vocab_size)


_compilers: dict[int, GrammarCompiler] = {}
_compilers_lock = threading.Lock()


def compiler_for(tokenizer, vocab_size: int, stop_ids: set[int]) -> GrammarCompiler:
    """The tokenizer's compiler, made on first use and kept (keyed by the tokenizer object, which it holds)."""
    key = id(tokenizer)
    with _compilers_lock:
        compiler = _compilers.get(key)
        if compiler is None or compiler.vocab_size != vocab_size:
            compiler = _compilers[key] = GrammarCompiler(tokenizer, vocab_size, stop_ids)
            compiler.source = tokenizer  # keeps id(tokenizer) from being reused while the entry exists
        return compiler


class Grammar:
    """One request's grammar state: the committed tokens consumed; drafts judged without changing it."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size
        self._bits = torch.arange(8, dtype=torch.uint8)

    def commit(self, tokens: list[int]) -> None:
        for token in tokens:
            if not self.matcher.consume_token(token):
                raise ForetellError(f"the output left its response_format grammar at token {token}: "
                                    f"{self.matcher.get_error()}")

    def allowed_nodes(self, proposal: Proposal) -> list[int] | None:
        """The draft nodes whose whole path the grammar accepts (None: all of them)."""
        tokens = proposal.tokens.tolist()
        if proposal.is_chain:
            ok = self.matcher.validate_tokens(tokens)
            return None if ok == len(tokens) else list(range(ok))
        parents = proposal.parents.tolist()
        valid: list[bool] = []
        for i, parent in enumerate(parents):
            path = [tokens[j] for j in path_to(i, parents)]
            valid.append((parent < 0 or valid[parent]) and self.matcher.validate_tokens(path) == len(path))
        return None if all(valid) else [i for i, v in enumerate(valid) if v]

    def allowed_rows(self, proposal: Proposal, rows: int, vocab: int) -> torch.Tensor:
        """[rows, vocab] bool: what the grammar allows after each row's path (row 0: the committed tokens; row
        i + 1: node i's path). Every node is one the grammar accepts (allowed_nodes ran first)."""
        masks = [self._mask()]
        tokens = proposal.tokens.tolist()
        parents = list(range(-1, len(tokens) - 1)) if proposal.is_chain else proposal.parents.tolist()
        consumed: list[int] = []  # the path the matcher has consumed beyond the committed tokens
        for node in range(rows - 1):
            path = path_to(node, parents)
            common = 0
            while common < min(len(consumed), len(path)) and consumed[common] == path[common]:
                common += 1
            if len(consumed) > common:
                self.matcher.rollback(len(consumed) - common)
            for j in path[common:]:
                if not self.matcher.consume_token(tokens[j]):
                    raise ForetellError(f"a draft the grammar was checked to allow was refused: "
                                        f"{self.matcher.get_error()}")
            consumed = path
            masks.append(self._mask())
        if consumed:
            self.matcher.rollback(len(consumed))
        allowed = torch.stack(masks)[:, :vocab]
        if allowed.shape[-1] < vocab:  # the model's vocabulary is wider than the grammar's
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[-1]), value=False)
        return allowed

    def _mask(self) -> torch.Tensor:
        """[vocab_size] bool from llguidance's bitmask (token t: bit t % 8 of byte t // 8)."""
        packed = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.uint8)
        return ((packed[:, None] >> self._bits) & 1).bool().flatten()[:self.vocab_size]
