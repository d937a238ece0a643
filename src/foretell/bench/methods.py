"""Decoding methods the benchmark compares, behind one small interface.

A method has a `name`, `run(prompt_ids, max_new_tokens) -> (tokens, stats)` and
`memory_bytes()` (its weights plus the KV caches of its last run). foretell's methods share one
loaded target and draft (`Pipeline.with_drafter`); the transformers peers share one HF copy.
A new drafter is one entry in METHODS.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Protocol

import torch

from foretell.api import Pipeline, load
from foretell.bench.runner import MONITOR_KEYS
from foretell.draft_gate import DraftGate
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.draft_tree import DraftTreeDrafter, TreeShape
from foretell.drafters.hidden_tree import DEFAULT_HOT_VOCAB
from foretell.drafters.parallel_tree import HeadTreeShape, ParallelHeadDrafter
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.errors import ForetellError
from foretell.lossy import check_lossy_threshold
from foretell.models.loading import parse_dtype, resolve_model_dir
from foretell.result_cache import make_result_cache
from foretell.types import SamplingParams


class Method(Protocol):
    name: str

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        """New tokens (stop token excluded) and {tau, target_passes, acceptance_per_position, ...}."""

    def memory_bytes(self) -> int: ...


@dataclass(frozen=True)
class MethodOptions:
    gamma: int = 4  # draft tokens per step (draft-chain, prompt lookup: foretell's and HF's)
    tree_depth: int = 5
    tree_topk: int = 4
    tree_budget: int = 24
    tree_branching: tuple[int, ...] = (3, 2, 2, 1, 1)  # draft-tree-static
    temperature: float = 0.0
    seed: int | None = None
    threads: int | None = None  # llama.cpp threads
    hot_vocab: int = 0  # draft-model methods: draft among this many frequent tokens (0 = all)

    def __post_init__(self):
        if not 1 <= self.gamma <= 16:
            raise ForetellError(f"--gamma (draft length) must be between 1 and 16, got {self.gamma}")
        # TreeShape checks the tree options and names the bad one.
        TreeShape(kind="dynamic", depth=self.tree_depth, top_k=self.tree_topk, total_tokens=self.tree_budget)
        TreeShape(kind="static", branching=self.tree_branching)
        SamplingParams(temperature=self.temperature, seed=self.seed)


@dataclass
class Models:
    """The weights every method draws on, each loaded once, on first use."""

    target: str
    draft: str | None = None
    dtype: str = "bfloat16"
    draft_quant: str = "none"  # every foretell draft-model method (they share the draft's weights) and the hidden-state draft
    head: str | None = None  # a saved parallel head folder, for the parallel-head* methods
    hidden_draft: str | None = None  # a saved hidden-state draft folder, for the hidden-state* methods
    _pipe: Pipeline | None = field(default=None, repr=False)
    _modules: dict = field(default_factory=dict, repr=False)  # (kind, hot-vocabulary size, quant) -> head or draft
    _hf: dict = field(default_factory=dict, repr=False)

    def pipeline(self) -> Pipeline:
        if self._pipe is None:
            drafter = "draft-model" if self.draft else "none"
            quant = self.draft_quant if self.draft else "none"
            self._pipe = load(self.target, draft=self.draft, drafter=drafter, dtype=self.dtype, draft_quant=quant)
        return self._pipe

    def parallel_head(self, hot_vocab: int = 0):
        """The parallel head, its output restricted to `hot_vocab` frequent tokens (0 = all)."""
        return self._shared_output_module("head", self.head, hot_vocab)

    def hidden_state_draft(self, hot_vocab: int):
        """The hidden-state draft, its output restricted to `hot_vocab` frequent tokens (0 = all)."""
        return self._shared_output_module("hidden", self.hidden_draft, hot_vocab)

    def _shared_output_module(self, kind: str, folder: str, hot_vocab: int):
        """A trained module that reuses the target's output layer, loaded once per hot-vocabulary size
        (and, for the hidden-state draft, per quantization mode)."""
        key = (kind, hot_vocab, self.draft_quant if kind == "hidden" else "none")
        if key not in self._modules:
            from foretell.api import draft_hot_vocab
            from foretell.models.hidden_draft import load_hidden_draft
            from foretell.models.parallel_head import load_parallel_head

            target = self.pipeline().target
            hot = draft_hot_vocab(target, target, hot_vocab)
            if kind == "head":
                self._modules[key] = load_parallel_head(folder, target.model, hot)
            else:
                self._modules[key] = load_hidden_draft(folder, target.model, hot).quantize(self.draft_quant)
        return self._modules[key]

    def hf(self, which: str):
        """The transformers copy of the target or the draft (separate weights: other module classes)."""
        if which not in self._hf:
            from transformers import AutoModelForCausalLM

            spec = self.target if which == "target" else self.draft
            folder = str(resolve_model_dir(spec))
            self._hf[which] = AutoModelForCausalLM.from_pretrained(folder, dtype=parse_dtype(self.dtype)).eval()
        return self._hf[which]


def param_bytes(*modules) -> int:
    """Bytes of the distinct weights, int8 buffers included (tied embeddings counted once)."""
    seen: dict[int, int] = {}
    for m in modules:
        for p in [*m.parameters(), *m.buffers()]:
            seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


def sampling(opts: MethodOptions, max_new_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=opts.temperature, seed=opts.seed, max_new_tokens=max_new_tokens)


class ForetellMethod:
    def __init__(self, name: str, pipe: Pipeline, drafter, opts: MethodOptions, length_policy="fixed",
                 lossy_threshold: float | None = None, result_cache: str | None = None):
        self.name = name
        self.pipe = pipe.with_drafter(drafter, length_policy, gamma=opts.gamma)
        if lossy_threshold is not None or result_cache:  # opt-in extras of the engine (lossy.py, result_cache.py)
            engine = replace(self.pipe.engine, lossy_threshold=lossy_threshold,
                             result_cache=make_result_cache(result_cache))
            self.pipe = replace(self.pipe, engine=engine)
        self.opts = opts
        self.cache_bytes = 0

    def run(self, prompt_ids, max_new_tokens):
        result = self.pipe.engine.generate(prompt_ids, sampling(self.opts, max_new_tokens))
        s = result.stats
        self.cache_bytes = s.cache_bytes
        return result.tokens, {
            "tau": s.tau, "target_passes": s.target_passes,
            "acceptance_per_position": s.acceptance_per_position,
            "proposed_per_position": s.proposed_per_position, "accepted_per_position": s.accepted_per_position,
            "mean_verified_drafts": s.draft_tokens_verified / s.target_passes if s.target_passes else 0.0,
            **{k: getattr(s, k) for k in MONITOR_KEYS},
        }

    def reset(self) -> None:
        """Drop state one run leaves for the next: the result cache's stored requests (so an untimed
        warm-up run cannot be reused by the timed run of the same prompt)."""
        if self.pipe.engine.result_cache is not None:
            self.pipe.engine.result_cache.clear()

    def memory_bytes(self) -> int:
        # A draft model, parallel head or hidden-state draft: whichever the drafter holds (weights it
        # shares with the target are counted once).
        drafter = self.pipe.engine.drafter
        owned = [getattr(drafter, name, None) for name in ("model", "head", "draft")]
        modules = [self.pipe.engine.target] + [m for m in owned if isinstance(m, torch.nn.Module)]
        return param_bytes(*modules) + self.cache_bytes


class HFMethod:
    """transformers `generate` on its own copy of the weights, with the same stop tokens as foretell."""

    def __init__(self, name: str, models: Models, opts: MethodOptions, assisted: bool = False, **generation):
        self.name = name
        self.model = models.hf("target")
        self.assistant = models.hf("draft") if assisted else None
        self.generation = generation  # extra GenerationConfig fields, e.g. prompt_lookup_num_tokens
        self.stop_ids = sorted(models.pipeline().engine.stop_ids)
        self.opts = opts
        self.seq_len = 0

    def _config(self, max_new_tokens: int):
        from transformers import GenerationConfig

        # A fresh config: the model's own generation_config.json may enable sampling or top-k.
        greedy = self.opts.temperature == 0
        kw = {} if greedy else dict(temperature=self.opts.temperature, top_k=0, top_p=1.0)
        return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, eos_token_id=self.stop_ids,
                                pad_token_id=self.stop_ids[0], **kw, **self.generation)

    def run(self, prompt_ids, max_new_tokens):
        ids = torch.tensor([prompt_ids])
        if self.opts.seed is not None:
            torch.manual_seed(self.opts.seed)
        calls = [0]  # target forwards, prefill included: each one yields >= 1 token
        hook = self.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                          generation_config=self._config(max_new_tokens), assistant_model=self.assistant)
        finally:
            hook.remove()
        produced = out[0, len(prompt_ids):].tolist()
        self.seq_len = len(prompt_ids) + len(produced)
        stop = next((i for i, t in enumerate(produced) if t in self.stop_ids), len(produced))
        return produced[:stop], {"tau": len(produced) / max(calls[0], 1), "target_passes": calls[0],
                                 "acceptance_per_position": []}

    def memory_bytes(self) -> int:
        # transformers' dynamic caches grow to the sequence length; size them from the config.
        models = [self.model] + ([self.assistant] if self.assistant is not None else [])
        cache = sum(hf_kv_bytes(m, self.seq_len) for m in models)
        return param_bytes(*models) + cache


def hf_kv_bytes(model, seq_len: int) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * seq_len * model.dtype.itemsize


class LlamaCppMethod:
    """llama-cpp-python on the model's original GGUF file (its own quantized weights)."""

    def __init__(self, gguf: Path, opts: MethodOptions, stop_ids: set[int]):
        from llama_cpp import Llama

        self.name = "llama-cpp"
        self.gguf = gguf
        self.llm = Llama(model_path=str(gguf), n_ctx=4096, n_threads=opts.threads, seed=opts.seed or 0, verbose=False)
        self.opts = opts
        self.stop_ids = stop_ids

    def run(self, prompt_ids, max_new_tokens):
        tokens = []
        sampled = dict(temp=self.opts.temperature, top_k=0, top_p=1.0, min_p=0.0)  # temp 0: llama.cpp is greedy
        for t in self.llm.generate(prompt_ids, reset=True, **sampled):
            if t in self.stop_ids:
                break
            tokens.append(t)
            if len(tokens) >= max_new_tokens:
                break
        return tokens, {"tau": 1.0, "target_passes": len(tokens), "acceptance_per_position": []}

    def memory_bytes(self) -> int:
        return self.gguf.stat().st_size  # weights only: llama.cpp's cache is not exposed


def gguf_file(spec: str) -> Path | None:
    """The original GGUF of a model spec, when one is still on disk (chunked presets are deleted after conversion)."""
    from foretell.models.presets import PRESETS, locate_single_gguf

    if spec in PRESETS and PRESETS[spec].single_file_module:
        return locate_single_gguf(PRESETS[spec])
    return Path(spec) if str(spec).endswith(".gguf") and Path(spec).is_file() else None


def make_llama_cpp(models: Models, opts: MethodOptions):
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install llama-cpp-python)"
    gguf = gguf_file(models.target)
    if gguf is None:
        return f"no GGUF file on disk for {models.target!r}"
    return LlamaCppMethod(gguf, opts, models.pipeline().engine.stop_ids)


def _hot(models: Models, o: MethodOptions):
    from foretell.api import draft_hot_vocab

    pipe = models.pipeline()
    return draft_hot_vocab(pipe.target, pipe.draft, o.hot_vocab)


def _chain(models: Models, o: MethodOptions) -> DraftModelDrafter:
    pipe = models.pipeline()
    return DraftModelDrafter(pipe.draft.model, pipe.target.config.vocab_size, _hot(models, o))


def _tree(models: Models, shape: TreeShape, o: MethodOptions, target_cost=None) -> DraftTreeDrafter:
    pipe = models.pipeline()
    return DraftTreeDrafter(pipe.draft.model, pipe.target.config.vocab_size, shape, target_cost, _hot(models, o))


def _dynamic(o: MethodOptions, budget: int | None = None) -> TreeShape:
    return TreeShape(kind="dynamic", depth=o.tree_depth, top_k=o.tree_topk, total_tokens=budget or o.tree_budget)


def _target_cost(models: Models):
    from foretell.budget import cost_curve

    pipe = models.pipeline()
    return cost_curve(pipe.target.model, models.target)


def _tree_auto(models: Models, o: MethodOptions):
    pipe = models.pipeline()
    # The tuner may pick any size up to the largest the sweep tries.
    shape = _dynamic(o, max(o.tree_budget, 64))
    return ForetellMethod("draft-tree-auto", pipe, _tree(models, shape, o, _target_cost(models)), o)


def _chain_auto(models: Models, o: MethodOptions):
    from foretell.budget import HardwareAwareLength, cost_curve

    pipe = models.pipeline()
    draft_step = cost_curve(pipe.draft.model, models.draft)(1)
    policy = HardwareAwareLength(_target_cost(models), draft_step, max_gamma=12)
    return ForetellMethod("draft-chain-auto", pipe, _chain(models, o), o, length_policy=policy)


BUDGET_BASES = ("draft-tree", "hidden-state", "hidden-state-lookup")  # the methods with an @N budget variant


def _fixed_budget_variant(name: str) -> MethodSpec | None:
    """'draft-tree@16', 'hidden-state@16', 'hidden-state-lookup@16': that tree verifying at most 16
    nodes a pass (budget sweeps; None when the name is not one)."""
    base, _, digits = name.partition("@")
    if base not in BUDGET_BASES or not digits.isdigit() or int(digits) < 1:
        return None
    budget = int(digits)
    if base == "draft-tree":
        return MethodSpec(_foretell(name, lambda m, o: _tree(m, _dynamic(o, budget), o)), True,
                          f"dynamic tree, budget {budget}")
    lookup = "prompt" if base == "hidden-state-lookup" else None
    build = lambda m, o: ForetellMethod(  # noqa: E731
        name, m.pipeline(), _hidden_state(HIDDEN_HOT_VOCAB, max_nodes=budget)(m, o), o, result_cache=lookup)
    return MethodSpec(build, help=f"foretell, hidden-state draft, tree of at most {budget} nodes"
                      + (" with prompt lookup's match as one more branch" if lookup else ""), needs_hidden_draft=True)


@dataclass(frozen=True)
class MethodSpec:
    # build(models, options) -> a Method, or a string saying why it is unavailable (then skipped)
    build: Callable[[Models, MethodOptions], object]
    needs_draft: bool = False
    help: str = ""
    needs_head: bool = False
    needs_hidden_draft: bool = False


def _scheduled_head_drafter(models: Models, o: MethodOptions) -> ParallelHeadDrafter:
    from foretell.drafters.tree_scheduler import AdaptiveTreeScheduler

    return ParallelHeadDrafter(models.parallel_head(o.hot_vocab), scheduler=AdaptiveTreeScheduler(_target_cost(models)))


HIDDEN_HOT_VOCAB = DEFAULT_HOT_VOCAB  # the hot-vocabulary size of the hidden-state methods
# name, hot vocabulary (0 = full), ablation switches, help suffix
HIDDEN_STATE_VARIANTS = (
    ("hidden-state", HIDDEN_HOT_VOCAB, {}, f" (--hidden-draft; {HIDDEN_HOT_VOCAB} hot tokens, token-info, resampling, fusion)"),
    ("hidden-state-full-vocab", 0, {}, ", full vocabulary (ablation)"),
    ("hidden-state-no-info", HIDDEN_HOT_VOCAB, {"token_info": False}, " without token-info (ablation)"),
    ("hidden-state-no-resample", HIDDEN_HOT_VOCAB, {"resample": False}, " without resampling (ablation)"),
    ("hidden-state-no-fusion", HIDDEN_HOT_VOCAB, {"fuse": False}, " without verification fusion (ablation)"),
    ("hidden-state-auto", HIDDEN_HOT_VOCAB, {"scheduled": True}, " with the adaptive scheduler (hardware-aware budget)"),
)


def _hidden_state(hot_vocab: int, scheduled: bool = False, **switches):
    from foretell.drafters.hidden_tree import HiddenStateDrafter, HiddenStateOptions
    from foretell.drafters.tree_scheduler import AdaptiveTreeScheduler

    def build(m: Models, o: MethodOptions) -> HiddenStateDrafter:
        scheduler = AdaptiveTreeScheduler(_target_cost(m)) if scheduled else None
        return HiddenStateDrafter(m.hidden_state_draft(hot_vocab), HiddenStateOptions(**switches), scheduler)

    return build


def _foretell(name: str, drafter: Callable[[Models, MethodOptions], object]):
    return lambda m, o: ForetellMethod(name, m.pipeline(), drafter(m, o), o)


METHODS: dict[str, MethodSpec] = {
    "plain": MethodSpec(_foretell("plain", lambda m, o: None), help="foretell, no drafter (the baseline)"),
    "prompt-lookup": MethodSpec(_foretell("prompt-lookup", lambda m, o: PromptLookupDrafter()),
                                help="foretell, n-gram prompt lookup"),
    "draft-chain": MethodSpec(_foretell("draft-chain", _chain), True, "foretell, draft model, chain of --gamma"),
    "draft-tree": MethodSpec(_foretell("draft-tree", lambda m, o: _tree(m, _dynamic(o), o)), True,
                             "foretell, draft model, EAGLE-2 dynamic tree (--tree-*)"),
    "draft-tree-static": MethodSpec(_foretell("draft-tree-static", lambda m, o: _tree(
        m, TreeShape(kind="static", branching=o.tree_branching), o)), True, "foretell, draft model, static top-k tree"),
    "draft-chain-auto": MethodSpec(_chain_auto, True, "foretell, draft model, hardware-aware chain length"),
    "draft-chain-rejection": MethodSpec(
        lambda m, o: ForetellMethod("draft-chain-rejection", m.pipeline(), _chain(m, o), o, length_policy="rejection-rate"),
        True, "foretell, draft model, seed 001's rejection-rate draft length (base --gamma)"),
    "draft-chain-additive": MethodSpec(
        lambda m, o: ForetellMethod("draft-chain-additive", m.pipeline(), _chain(m, o), o, length_policy="additive"),
        True, "foretell, draft model, transformers' +2/-1 draft length (base --gamma)"),
    "draft-tree-auto": MethodSpec(_tree_auto, True, "foretell, dynamic tree, hardware-aware depth and size"),
    "parallel-head": MethodSpec(_foretell("parallel-head", lambda m, o: _head_drafter(m, o)), help=
                                "foretell, parallel draft head tree (--head); variants: parallel-head-lossy-T "
                                "(LOSSY, threshold T), parallel-head-cache (result cache), parallel-head-lookup (prompt "
                                "lookup's match merged into the tree); the same for parallel-head-auto", needs_head=True),
    "parallel-head-auto": MethodSpec(_foretell("parallel-head-auto", _scheduled_head_drafter), help=
                                     "foretell, parallel head with the adaptive scheduler (budget, depth, width "
                                     "per step)", needs_head=True),
    **{name: MethodSpec(_foretell(name, _hidden_state(hot, **switches)), help=f"foretell, hidden-state draft{what}",
                        needs_hidden_draft=True)
       for name, hot, switches, what in HIDDEN_STATE_VARIANTS},
    "hf-plain": MethodSpec(lambda m, o: HFMethod("hf-plain", m, o), help="transformers generate"),
    "hf-assisted": MethodSpec(lambda m, o: HFMethod("hf-assisted", m, o, assisted=True), True,
                              "transformers assisted generation (its own draft-length schedule)"),
    "hf-prompt-lookup": MethodSpec(lambda m, o: HFMethod("hf-prompt-lookup", m, o, prompt_lookup_num_tokens=o.gamma),
                                   help="transformers prompt lookup (--gamma tokens)"),
    "llama-cpp": MethodSpec(make_llama_cpp, help="llama-cpp-python on the GGUF file, if installed"),
}


def default_methods(has_draft: bool) -> list[str]:
    if has_draft:
        return ["plain", "prompt-lookup", "draft-chain", "draft-tree", "hf-plain", "hf-assisted"]
    return ["plain", "prompt-lookup", "hf-plain", "hf-prompt-lookup"]


def build_methods(names: list[str], models: Models, opts: MethodOptions, warn=print) -> list:
    """Methods in the given order; unavailable optional ones are skipped with a message via `warn`."""
    specs = {n: _method_spec(n) for n in names}
    unknown = [n for n, spec in specs.items() if spec is None]
    if unknown:
        raise ForetellError(f"unknown method(s) {', '.join(unknown)}; use {', '.join(METHODS)}, "
                            f"{' / '.join(b + '@N' for b in BUDGET_BASES)}, "
                            f"M-lossy-T / M-cache / M-lookup for M in {', '.join(EXTRAS_BASES)}, "
                            f"M-gate for a parallel-head / hidden-state -auto method M (with the draft gate), "
                            f"or M-fp for a hidden-state method M (its draft unquantized)")
    needing = [n for n in names if specs[n].needs_draft]
    if needing and not models.draft:
        raise ForetellError(f"method(s) {', '.join(needing)} need a draft model: pass --draft")
    needing = [n for n in names if specs[n].needs_head]
    if needing and not models.head:
        raise ForetellError(f"method(s) {', '.join(needing)} need a parallel head folder: pass --head")
    needing = [n for n in names if specs[n].needs_hidden_draft]
    if needing and not models.hidden_draft:
        raise ForetellError(f"method(s) {', '.join(needing)} need a hidden-state draft folder: pass --hidden-draft")
    built = []
    for n in names:
        method = specs[n].build(models, opts)
        if isinstance(method, str):
            warn(f"foretell bench: skipping {n}: {method}")
        else:
            built.append(method)
    return built


def _method_spec(name: str) -> MethodSpec | None:
    if name.endswith(GATE):  # M-gate: M (a tree drafter's -auto method) with the draft gate (draft_gate.py)
        spec = _method_spec(name[: -len(GATE)])
        if spec is None or "-auto" not in name or not name.startswith(("parallel-head", "hidden-state")):
            return None
        return replace(spec, build=lambda m, o, build=spec.build: _with_gate(build(m, o), name),
                       help=f"{spec.help}, with the draft gate")
    if name.endswith(FULL_PRECISION) and name.startswith("hidden-state"):  # M-fp: M without the int8 draft
        spec = _method_spec(name[: -len(FULL_PRECISION)])
        if spec is None:
            return None
        return replace(spec, build=lambda m, o, build=spec.build: _renamed(build(_full_precision(m), o), name),
                       help=f"{spec.help}, full-precision draft (no int8; the same-run reference for --draft-quant)")
    return METHODS.get(name) or _fixed_budget_variant(name) or _extras_variant(name)


GATE = "-gate"
FULL_PRECISION = "-fp"


def _full_precision(models: Models) -> Models:
    """The same target and module cache, with the hidden-state draft loaded unquantized."""
    models.pipeline()  # load the target first, so both views share it
    return replace(models, draft_quant="none")


def _renamed(method, name: str):
    method.name = name
    return method


def _with_gate(method, name: str):
    if isinstance(method, ForetellMethod):
        method.name = name
        method.pipe = replace(method.pipe, engine=replace(method.pipe.engine, draft_gate=DraftGate()))
    return method


def _head_drafter(models: Models, o: MethodOptions) -> ParallelHeadDrafter:
    head = models.parallel_head(o.hot_vocab)
    return ParallelHeadDrafter(head, HeadTreeShape(depth=min(HeadTreeShape().depth, head.config.depth)))


# Methods that take the engine's opt-in extras: name-lossy-T (LOSSY verification at threshold T)
# and name-cache (the result cache; tree drafters only).
EXTRAS_BASES = ("parallel-head-auto", "parallel-head", "hidden-state-auto", "hidden-state", "draft-tree",
                "draft-chain")  # a longer name before its prefix


def _extras_variant(name: str) -> MethodSpec | None:
    """'parallel-head-lossy-0.85' or 'draft-tree-cache' -> a spec; None when the name is not one."""
    for base in EXTRAS_BASES:
        if not name.startswith(base + "-"):
            continue
        rest = name[len(base) + 1 :]
        lossy, cache = None, None
        if rest.startswith("lossy-"):
            try:
                lossy = check_lossy_threshold(float(rest[len("lossy-"):]))
            except ValueError:
                return None
        elif rest in ("cache", "lookup") and base != "draft-chain":
            cache = "prompt" if rest == "lookup" else "outputs"
        else:
            return None
        spec = METHODS[base]
        drafter = {"parallel-head": _head_drafter, "parallel-head-auto": _scheduled_head_drafter,
                   "hidden-state": _hidden_state(HIDDEN_HOT_VOCAB), "hidden-state-auto": _hidden_state(HIDDEN_HOT_VOCAB, True),
                   "draft-tree": lambda m, o: _tree(m, _dynamic(o), o), "draft-chain": _chain}[base]
        build = lambda m, o, d=drafter: ForetellMethod(name, m.pipeline(), d(m, o), o, lossy_threshold=lossy,  # noqa: E731
                                                       result_cache=cache)
        what = (f"LOSSY at threshold {lossy:g}" if lossy is not None else "with the result cache"
                if cache == "outputs" else "with prompt lookup's match as one more tree branch")
        return MethodSpec(build, spec.needs_draft, f"{spec.help}, {what}", spec.needs_head, spec.needs_hidden_draft)
    return None
