"""The speculative configuration: which drafter, with which options, checked once before anything loads.

One object for the Python API (`foretell.load(model, speculative=...)`), the CLI (`--spec-config FILE` and
the flags that map onto it), the bench (`--spec-config NAME=FILE` methods) and the server. As in vLLM's
SpeculativeConfig, a `method` names the drafter and only the options that method uses may differ from their
defaults: an option set for a method that ignores it is an error, never silently dropped (APPLIES_TO).
Files are JSON: `{"method": "parallel-head", "model": "runs/head", "budget": "auto"}`.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path

from foretell.errors import ForetellError

METHODS = ("none", "prompt-lookup", "draft-model", "draft-tree", "parallel-head", "hidden-state", "eagle3")
TREE_METHODS = ("draft-tree", "parallel-head", "hidden-state", "eagle3")  # propose trees; size themselves
WEIGHTED_METHODS = ("draft-model", "draft-tree", "parallel-head", "hidden-state", "eagle3")  # need `model`: their weights
HEAD_METHODS = ("parallel-head", "hidden-state", "eagle3")  # without `model`: the target's shipped drafter of the kind
# Drafters scoring the target's output layer (or a draft model's): a hot vocabulary cuts it. An EAGLE-3 head
# has its own reduced draft vocabulary instead (its d2t map), so hot_vocab does not apply to it.
HOT_VOCAB_METHODS = ("draft-model", "draft-tree", "parallel-head", "hidden-state")
LENGTH_POLICIES = ("fixed", "rejection-rate", "additive")
QUANT_MODES = ("auto", "int8", "int4", "none", "gguf", "gguf-q8")
GGUF_DRAFT_QUANTS = ("gguf", "gguf-q8")  # a draft model's own GGUF blocks (float / 8-bit activations)
BUDGETS = ("fixed", "auto")
RESULT_CACHES = ("outputs", "prompt")

# Prompt tokens a pass reads by default. Every request decoding beside a prompt waits for that pass: on a 2-core
# AVX2 CPU the longest waits between a request's tokens (p99) were 357 / 204 / 109 ms at chunks of 256 / 128 / 64
# with 4 clients, for the same tokens/s; 64 doubled the median wait at 16 clients, 128 did not
# (benchmarks/serve/prefill_chunks.sh).
DEFAULT_PREFILL_CHUNK = 128

RESAMPLE_TRIGGERS = ("unsure", "plausible", "always")


def check_types(obj, what: str) -> None:
    """Raise a ForetellError naming the first field of dataclass `obj` whose value has the wrong type.

    JSON files and keyword arguments arrive untyped; a "4" for an int would otherwise fail deep inside a
    drafter. bool is not accepted for int fields (True is an int to Python), int is accepted for float ones.
    """
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        if f.name.startswith("_"):
            continue
        value = getattr(obj, f.name)
        if not _matches(value, hints[f.name]):
            raise ForetellError(f"{what}: {f.name} must be {_describe(hints[f.name])}, got {value!r}")


def _matches(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is tuple:  # tuple[int, ...]
        return isinstance(value, tuple) and all(_matches(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        return f"a list of {_describe(args[0])}s"
    if args:
        return " or ".join(_describe(a) for a in args)
    return {type(None): "null", int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint)))


@dataclass(frozen=True)
class TreeShape:
    """draft-tree: the token tree a draft model grows, level by level."""

    kind: str = "dynamic"  # static | dynamic (EAGLE-2: expand the best nodes, keep the best total_tokens)
    branching: tuple[int, ...] = (3, 2, 2, 1, 1)  # static: children per node at depth 1, 2, ...
    depth: int = 5  # dynamic
    top_k: int = 4  # dynamic: nodes expanded per level, children each
    total_tokens: int = 24  # dynamic: the verification budget (nodes, root excluded)
    children: str = "topk"  # topk | sampled (static only)

    def __post_init__(self):
        check_types(self, "tree")
        if self.kind not in ("static", "dynamic"):
            raise ForetellError(f"tree kind must be static or dynamic, got {self.kind!r}")
        if self.children not in ("topk", "sampled"):
            raise ForetellError(f"tree children must be topk or sampled, got {self.children!r}")
        if self.kind == "dynamic" and self.children == "sampled":
            raise ForetellError("dynamic trees prune children by value, so they need topk children (sampled is static only)")
        if self.kind == "static" and (not self.branching or min(self.branching) < 1):
            raise ForetellError(f"static tree branching must be positive integers, got {self.branching}")
        if self.kind == "dynamic" and min(self.depth, self.top_k, self.total_tokens) < 1:
            raise ForetellError("dynamic tree depth, top_k and total_tokens must be >= 1")

    @property
    def max_depth(self) -> int:
        return len(self.branching) if self.kind == "static" else self.depth

    @property
    def max_nodes(self) -> int:
        if self.kind == "dynamic":
            return self.total_tokens
        total, width = 0, 1
        for b in self.branching:
            width *= b
            total += width
        return total


@dataclass(frozen=True)
class HeadTreeShape:
    """parallel-head: the best-first tree over the head's per-depth distributions."""

    max_nodes: int = 16  # the verification budget (nodes, root excluded)
    depth: int = 4  # at most the head's depth D
    width: int = 3  # children per node

    def __post_init__(self):
        check_types(self, "head_tree")
        if min(self.max_nodes, self.depth, self.width) < 1:
            raise ForetellError(
                f"parallel-head tree max_nodes, depth and width must be >= 1, got {self.max_nodes}, {self.depth}, {self.width}"
            )


@dataclass(frozen=True)
class HiddenStateOptions:
    """hidden-state: tree shape (defaults from Make Every Draft Count: depth 5, branching 3) and the ablation switches."""

    depth: int = 5  # draft steps per regular proposal = maximum tree depth
    width: int = 3  # children offered per node (top-k)
    max_nodes: int = 24  # the verification budget (nodes, root excluded)
    token_info: bool = True  # add E(node token) to the children's logits
    resample: bool = True  # build a subtree from the last chain's logits after a rejection
    fuse: bool = True  # verify it with the next regular tree in one pass (else alone, first)
    resample_depth: int = 3  # levels of a resampled subtree (the paper: 3-5)
    # Trigger, on the draft's distribution at the rejected position (the children of the last
    # accepted node): "unsure" = its top probability < threshold (the draft had no clear
    # favourite there, so the target's token carries the most news); "plausible" = it gave the
    # target's token >= threshold; "always".
    resample_when: str = "unsure"
    resample_threshold: float = 0.2
    token_info_cache: int = 0  # precompute E for this many output tokens (0 = compute per node)

    def __post_init__(self):
        check_types(self, "hidden")
        if min(self.depth, self.width, self.max_nodes, self.resample_depth) < 1:
            raise ForetellError(
                "hidden-state tree depth, width, max_nodes and resample_depth must be >= 1, got "
                f"{self.depth}, {self.width}, {self.max_nodes}, {self.resample_depth}"
            )
        if self.resample_when not in RESAMPLE_TRIGGERS:
            raise ForetellError(f"resample_when must be one of {', '.join(RESAMPLE_TRIGGERS)}, got {self.resample_when!r}")
        if not 0.0 <= self.resample_threshold <= 1.0:
            raise ForetellError(f"resample_threshold must be in [0, 1], got {self.resample_threshold}")
        if self.token_info_cache < 0:
            raise ForetellError(f"token_info_cache must be >= 0, got {self.token_info_cache}")


@dataclass(frozen=True)
class EagleTreeShape:
    """eagle3: the EAGLE-2 dynamic tree an EAGLE-3 head grows, one head step per level."""

    depth: int = 5  # draft steps = the tree's depth
    width: int = 4  # EAGLE-2's top-k: nodes expanded per level, and children of each
    max_nodes: int = 24  # the verification budget: the best nodes of the grown tree (root excluded)

    def __post_init__(self):
        check_types(self, "eagle_tree")
        if min(self.depth, self.width, self.max_nodes) < 1:
            raise ForetellError(
                f"eagle3 tree depth, width and max_nodes must be >= 1, got {self.depth}, {self.width}, {self.max_nodes}"
            )


# Which methods each option applies to, and the CLI flag that sets it: the one table validation reads.
# An option may differ from its default only for these methods.
APPLIES_TO: dict[str, tuple[tuple[str, ...], str]] = {
    "model": (WEIGHTED_METHODS, "--draft / --head / --hidden-draft / --eagle"),
    "gamma": (("draft-model", "prompt-lookup"), "--gamma"),
    "length_policy": (("draft-model", "prompt-lookup"), "--length-policy"),
    "lookup_max": (("prompt-lookup",), "--lookup-max"),
    "lookup_min": (("prompt-lookup",), "--lookup-min"),
    "tree": (("draft-tree",), "--tree-kind / --branching / --tree-children, --tree-depth / --tree-width / --tree-budget"),
    "head_tree": (("parallel-head",), "--tree-depth / --tree-width / --tree-budget"),
    "hidden": (("hidden-state",), "--tree-depth / --tree-width / --tree-budget"),
    "eagle_tree": (("eagle3",), "--tree-depth / --tree-width / --tree-budget"),
    "hot_vocab": (HOT_VOCAB_METHODS, "--hot-vocab"),
    "draft_quant": (("draft-model", "draft-tree", "parallel-head", "hidden-state", "eagle3"), "--draft-quant"),
    "budget": (WEIGHTED_METHODS, "--budget"),
    "result_cache": (TREE_METHODS, "--result-cache"),
    "corpus": (("prompt-lookup", *TREE_METHODS), "--corpus"),
    "draft_gate": (TREE_METHODS, "--draft-gate"),
    "lossy_threshold": (WEIGHTED_METHODS, "--lossy-threshold"),
}
NESTED = {"tree": TreeShape, "head_tree": HeadTreeShape, "hidden": HiddenStateOptions, "eagle_tree": EagleTreeShape}


@dataclass(frozen=True)
class SpeculativeConfig:
    """How foretell speculates. `method` picks the drafter; see APPLIES_TO for which option goes with which.

    model: the drafter's weights: a draft model (preset, .gguf file or HF folder) for draft-model and
        draft-tree; a saved head folder for parallel-head; a saved hidden-state draft folder for hidden-state; an
        EAGLE-3 head for eagle3 (foretell's folder, or an EAGLE-3 checkpoint in the layout vLLM and SGLang load).
    gamma, length_policy: draft tokens per pass and how that number adapts (fixed, a recent-rejection-rate
        rule, transformers' +2/-1 additive rule).
    lookup_max, lookup_min: prompt lookup's longest and shortest n-gram to match, tried longest first.
    tree / head_tree / hidden / eagle_tree: the tree of draft-tree / parallel-head / hidden-state / eagle3
        (head_tree None: as deep as the head drafts, up to 4).
    hot_vocab: draft among this many frequent tokens only (0 = all; lossless).
    draft_quant: int8 draft weights (auto = int8 on CPU, except bf16 drafts where foretell's bf16 kernel runs
        (runtime/quant.py resolve_quant), and for a parallel head only on a target with 8-bit activations), or
        int4 (groups of 32, CPU only); lossless: only acceptance can change. A draft model may also run its
        GGUF file's own blocks in the lean step: gguf, or gguf-q8 with 8-bit activations (float32 CPU).
    budget: fixed, or auto: draft length / tree size chosen each pass from this machine's measured cost curve.
    result_cache: outputs | prompt: continuations seen before (in earlier outputs; with prompt, the prompt
        too) join a tree proposal as one more branch (lossless).
    corpus: a corpus of the target's own answers (a shipped corpus name, e.g. smollm2-135m-answers, or a file
        made by `foretell corpus`): where the prompt and output offer no n-gram match, its most frequent
        continuation is proposed instead (prompt lookup's draft; a tree drafter's result-cache branch; lossless).
    draft_gate: before each pass, decide from measured tokens/s whether drafting pays (lossless).
    lossy_threshold: LOSSY, opt-in: accept a draft token without the target's check when its draft path
        probability exceeds this value in (0, 1]; the output then no longer follows the target exactly.
    """

    method: str = "prompt-lookup"
    model: str | None = None
    gamma: int = 4
    length_policy: str = "fixed"
    lookup_max: int = 3
    lookup_min: int = 1
    tree: TreeShape = field(default_factory=TreeShape)
    head_tree: HeadTreeShape | None = None
    hidden: HiddenStateOptions = field(default_factory=HiddenStateOptions)
    eagle_tree: EagleTreeShape = field(default_factory=EagleTreeShape)
    hot_vocab: int = 0
    draft_quant: str = "auto"
    budget: str = "fixed"
    result_cache: str | None = None
    corpus: str | None = None
    draft_gate: bool = False
    lossy_threshold: float | None = None

    def __post_init__(self):
        if isinstance(self.model, Path):
            object.__setattr__(self, "model", str(self.model))
        check_types(self, "speculative config")
        if self.method not in METHODS:
            raise ForetellError(f"unknown speculative method {self.method!r}; use one of {', '.join(METHODS)}")
        for option, (methods, flag) in APPLIES_TO.items():
            if self.method not in methods and self._is_set(option):
                raise ForetellError(
                    f"{option} ({flag}) applies to the {', '.join(methods)} method(s), not {self.method}: "
                    f"remove it or pick one of those methods"
                )
        if self.method in WEIGHTED_METHODS and self.method not in HEAD_METHODS and not self.model:
            # a head method without one uses the target's shipped drafter of that kind (DrafterWeights.folder)
            raise ForetellError(f"the {self.method} method needs model: a draft model (--draft): preset, .gguf file "
                                "or HF folder")
        self._check_values()

    def _is_set(self, option: str) -> bool:
        f = next(f for f in fields(self) if f.name == option)
        default = f.default_factory() if f.default is MISSING else f.default
        return getattr(self, option) != default

    def _check_values(self) -> None:
        checks = (
            (1 <= self.gamma <= 16, f"gamma (draft length) must be between 1 and 16, got {self.gamma}"),
            (self.length_policy in LENGTH_POLICIES,
             f"length_policy must be one of {', '.join(LENGTH_POLICIES)}, got {self.length_policy!r}"),
            (1 <= self.lookup_min <= self.lookup_max,
             f"prompt lookup needs 1 <= lookup_min <= lookup_max, got {self.lookup_min} and {self.lookup_max}"),
            (self.hot_vocab >= 0, f"hot_vocab must be >= 0 (0 = full vocabulary), got {self.hot_vocab}"),
            (self.draft_quant in QUANT_MODES, f"draft_quant must be one of {', '.join(QUANT_MODES)}, got {self.draft_quant!r}"),
            (self.draft_quant not in GGUF_DRAFT_QUANTS or self.method in ("draft-model", "draft-tree"),
             f"draft_quant {self.draft_quant!r} runs a draft model's GGUF blocks: it applies to draft-model and "
             f"draft-tree, not {self.method}; use auto, int8 or none"),
            (self.budget in BUDGETS, f"budget must be fixed or auto (hardware-aware), got {self.budget!r}"),
            (self.result_cache in (None, *RESULT_CACHES),
             f"result_cache must be outputs, prompt or null (off), got {self.result_cache!r}"),
            (self.lossy_threshold is None or 0.0 < self.lossy_threshold <= 1.0,
             f"lossy_threshold must be in (0, 1] (LOSSY) or null (lossless), got {self.lossy_threshold}"),
            (not (self.budget == "auto" and self.length_policy != "fixed"),
             f"length_policy {self.length_policy} and budget auto both set the draft length: keep one"),
            (not (self.budget == "auto" and self.head_tree is not None),
             "head_tree fixes the parallel head's tree, budget auto picks it each pass: keep one"),
            (not (self.budget == "auto" and self.hidden.max_nodes != HiddenStateOptions().max_nodes),
             "hidden.max_nodes fixes the hidden-state tree's size, budget auto picks it each pass: keep one"),
            (not (self.budget == "auto" and self.eagle_tree.max_nodes != EagleTreeShape().max_nodes),
             "eagle_tree.max_nodes fixes the eagle3 tree's size, budget auto picks it each pass: keep one"),
        )
        for ok, message in checks:
            if not ok:
                raise ForetellError(message)

    @property
    def drafts(self) -> bool:
        return self.method != "none"

    @property
    def lossy(self) -> bool:
        return self.lossy_threshold is not None

    def describe(self) -> str:
        """One line for logs: the method and every option that differs from its default."""
        rest = {k: v for k, v in self.to_dict().items() if k != "method"}
        return self.method + (" " + json.dumps(rest, separators=(",", ":")) if rest else "")

    def to_dict(self) -> dict:
        """The method and the options that differ from their defaults (nested shapes in full), JSON-ready."""
        out: dict = {"method": self.method}
        for f in fields(self):
            if f.name != "method" and self._is_set(f.name):
                value = getattr(self, f.name)
                out[f.name] = _jsonable(asdict(value) if is_dataclass(value) else value)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, data: dict, where: str = "speculative config") -> SpeculativeConfig:
        if not isinstance(data, dict):
            raise ForetellError(f"{where} must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ForetellError(f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = {k: _tuples(v) for k, v in data.items()}
        for name, shape in NESTED.items():
            if isinstance(values.get(name), dict):
                values[name] = _nested(shape, values[name], f"{where}: {name}")
        return cls(**values)

    @classmethod
    def from_json(cls, text: str, where: str = "speculative config") -> SpeculativeConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ForetellError(f"{where} is not valid JSON ({e})") from None
        return cls.from_dict(data, where)

    @classmethod
    def from_file(cls, path: str | Path) -> SpeculativeConfig:
        path = Path(path)
        if not path.is_file():
            raise ForetellError(f"no speculative config file {str(path)!r}; write one with SpeculativeConfig.save "
                                "or `foretell generate ... --save-spec-config FILE`")
        return cls.from_json(path.read_text(encoding="utf-8"), where=str(path))

    def with_tree(self, depth: int | None = None, width: int | None = None, nodes: int | None = None,
                  head_depth: int | None = None) -> SpeculativeConfig:
        """The same config with its tree's depth, width (children per node) and node budget replaced,
        whichever tree its method grows. head_depth: the parallel head's depth D, the default depth."""
        if depth is None and width is None and nodes is None:
            return self
        if self.method not in TREE_METHODS:
            raise ForetellError(f"--tree-depth / --tree-width / --tree-budget shape a tree drafter's tree "
                                f"({', '.join(TREE_METHODS)}), not {self.method}")
        keep = lambda new, old: old if new is None else new  # noqa: E731
        if self.method == "draft-tree":
            t = self.tree
            if t.kind == "static":
                raise ForetellError("a static draft tree is shaped by --branching; --tree-depth / --tree-width / "
                                    "--tree-budget shape a dynamic one")
            return replace(self, tree=replace(t, depth=keep(depth, t.depth), top_k=keep(width, t.top_k),
                                              total_tokens=keep(nodes, t.total_tokens)))
        if self.method == "hidden-state":
            h = self.hidden
            return replace(self, hidden=replace(h, depth=keep(depth, h.depth), width=keep(width, h.width),
                                                max_nodes=keep(nodes, h.max_nodes)))
        if self.method == "eagle3":
            e = self.eagle_tree
            return replace(self, eagle_tree=replace(e, depth=keep(depth, e.depth), width=keep(width, e.width),
                                                    max_nodes=keep(nodes, e.max_nodes)))
        base = self.head_tree or HeadTreeShape(depth=min(HeadTreeShape().depth, head_depth or HeadTreeShape().depth))
        return replace(self, head_tree=HeadTreeShape(keep(nodes, base.max_nodes), keep(depth, base.depth),
                                                     keep(width, base.width)))


def _nested(shape, data: dict, where: str):
    known = {f.name for f in fields(shape)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ForetellError(f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return shape(**{k: _tuples(v) for k, v in data.items()})


def _tuples(value):
    """JSON lists back to the tuples the dataclasses hold."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _jsonable(value):
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def as_speculative(spec: SpeculativeConfig | dict | str) -> SpeculativeConfig:
    """A SpeculativeConfig from the forms the API accepts: the object, its dict, or a bare method name."""
    if isinstance(spec, SpeculativeConfig):
        return spec
    if isinstance(spec, dict):
        return SpeculativeConfig.from_dict(spec)
    if isinstance(spec, str):
        if spec not in METHODS:
            raise ForetellError(f"speculative={spec!r} is not a method ({', '.join(METHODS)}); for a file use "
                                "SpeculativeConfig.from_file(path)")
        return SpeculativeConfig(method=spec)
    raise ForetellError(f"speculative must be a SpeculativeConfig, a dict or a method name, got {type(spec).__name__}")
