"""Decoding methods the benchmark compares, behind one small interface.

A method has a `name`, `run(prompt_ids, max_new_tokens) -> (tokens, stats)`, `memory_bytes()` (its
weights plus the KV caches of its last run) and `reset()`. Every foretell method is a SpeculativeConfig
over one loaded target (`Pipeline.with_speculative`, drafter weights shared): named methods (METHODS),
their variants (M@N, M-lookup, M-cache, M-lossy-T, M-gate, M-fp: `variant_spec`), and configurations
from files (`foretell bench --spec-config NAME=FILE`). The transformers and llama.cpp peers run their own
copies of the weights (llama.cpp: its own llama-server binary, llama_server.py; the Python binding stays as
llama-cpp-python).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Protocol

import torch

from foretell.api import Pipeline, load
from foretell.bench.llama_server import (INSTALL_COMMAND, PEER_CONFIGS, LlamaServer, PeerConfig, build_info,
                                         completion_request, find_binary, missing_binary, parse_completion, peer_gguf)
from foretell.bench.runner import MONITOR_KEYS
from foretell.config import HiddenStateOptions, SpeculativeConfig, TreeShape
from foretell.drafters.hidden_tree import DEFAULT_HOT_VOCAB
from foretell.errors import ForetellError
from foretell.runtime.loading import kept_gguf, parse_dtype, resolve_model_dir
from foretell.types import SamplingParams


class Method(Protocol):
    name: str

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        """New tokens (stop token excluded) and {tau, target_passes, acceptance_per_position, ...}."""

    def memory_bytes(self) -> int: ...

    def reset(self) -> None:
        """Drop state one run leaves for the next (the untimed warm-up must not help the timed run)."""


@dataclass(frozen=True)
class MethodOptions:
    gamma: int = 4  # draft tokens per step (draft-chain, prompt lookup: foretell's and HF's)
    tree_depth: int = 5
    tree_topk: int = 4
    tree_budget: int = 24
    tree_branching: tuple[int, ...] = (3, 2, 2, 1, 1)  # draft-tree-static
    temperature: float = 0.0
    seed: int | None = None
    sampling: str | None = None  # foretell's rule for sampled tokens (SamplingParams.sampling; None: its default)
    threads: int | None = None  # llama.cpp threads
    hot_vocab: int = 0  # draft-model and parallel-head methods: draft among this many frequent tokens (0 = all)
    caches: bool = False  # llama-server's prompt cache on (foretell's result caches: the runner's reset per request)

    def __post_init__(self):
        if not 1 <= self.gamma <= 16:
            raise ForetellError(f"--gamma (draft length) must be between 1 and 16, got {self.gamma}")
        # TreeShape checks the tree options and names the bad one.
        TreeShape(kind="dynamic", depth=self.tree_depth, top_k=self.tree_topk, total_tokens=self.tree_budget)
        TreeShape(kind="static", branching=self.tree_branching)
        SamplingParams(temperature=self.temperature, seed=self.seed, sampling=self.sampling)


@dataclass
class Models:
    """The weights the methods draw on: the target (loaded once, on first use, with a store of drafter
    weights every foretell method shares) and the drafter files the named methods use."""

    target: str
    draft: str | None = None
    dtype: str = "bfloat16"
    draft_quant: str = "none"  # the named draft-model, hidden-state and eagle3 methods (M-fp: none)
    head: str | None = None  # a saved parallel head folder, for the parallel-head* methods
    hidden_draft: str | None = None  # a saved hidden-state draft folder, for the hidden-state* methods
    eagle: str | None = None  # an EAGLE-3 head (foretell's folder or an engine checkpoint), for the eagle3* methods
    quant: str = "none"  # foretell's target weights: none | int8 | int4 (the peers keep their own)
    kv_dtype: str | None = None  # foretell's target KV cache (None: the model's dtype)
    _pipe: Pipeline | None = field(default=None, repr=False)
    _hf: dict = field(default_factory=dict, repr=False)

    def pipeline(self) -> Pipeline:
        if self._pipe is None:
            self._pipe = load(self.target, "none", dtype=self.dtype, quant=self.quant, kv_dtype=self.kv_dtype)
        return self._pipe

    def hf(self, which: str):
        """The transformers copy of the target or the draft (separate weights: other module classes)."""
        if which not in self._hf:
            # start-up: transformers takes about a second to import, and only the transformers baseline uses it
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
    return SamplingParams(temperature=opts.temperature, seed=opts.seed, sampling=opts.sampling,
                          max_new_tokens=max_new_tokens)


class ForetellMethod:
    """foretell's engine under one SpeculativeConfig."""

    def __init__(self, name: str, pipe: Pipeline, spec: SpeculativeConfig, opts: MethodOptions):
        self.name = name
        self.spec = spec
        self.pipe = pipe.with_speculative(spec)
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
        """The result cache's stored requests go (an untimed warm-up run must not feed the timed run)."""
        if self.pipe.engine.result_cache is not None:
            self.pipe.engine.result_cache.clear()

    def memory_bytes(self) -> int:
        # The target plus whatever the drafter holds (weights it shares with the target counted once).
        drafter = self.pipe.engine.drafter
        modules = drafter.modules() if drafter is not None else ()
        return param_bytes(self.pipe.engine.target, *modules) + self.cache_bytes


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
        # start-up: transformers takes about a second to import, and only the transformers baseline uses it
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

    def reset(self) -> None:
        pass  # nothing outlives a call to generate

    def memory_bytes(self) -> int:
        # transformers' dynamic caches grow to the sequence length; size them from the config.
        models = [self.model] + ([self.assistant] if self.assistant is not None else [])
        cache = sum(hf_kv_bytes(m, self.seq_len) for m in models)
        return param_bytes(*models) + cache


def hf_kv_bytes(model, seq_len: int) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * seq_len * model.dtype.itemsize


class LlamaServerMethod:
    """llama.cpp's own llama-server on the model's GGUF file (its own quantized weights), one process for the
    whole bench: each prompt goes to /completion as foretell's token ids, prompt caching off unless --caches."""

    def __init__(self, name: str, server: LlamaServer, opts: MethodOptions, stop_ids: set[int], build: dict):
        self.name = name
        self.server = server
        self.opts = opts
        self.stop_ids = stop_ids
        # what the run records of this peer (bench.json): the install script's build record, cmake flags included
        self.peer = {"command": server.command[1:], "build": build}

    def run(self, prompt_ids, max_new_tokens):
        body = completion_request(prompt_ids, max_new_tokens, self.opts.temperature, self.opts.seed)
        body["cache_prompt"] = self.opts.caches
        return parse_completion(self.server.post("/completion", body), self.stop_ids)

    def reset(self) -> None:
        pass  # without --caches no prompt cache: nothing outlives a request (with it, the server's cache stays)

    def memory_bytes(self) -> int:
        return self.server.rss_bytes()  # weights, KV cache and buffers of the server process


def llama_method_name(cfg: PeerConfig) -> str:
    """The bench's method name of a llama.cpp configuration: llama-cpp, llama-cpp-ngram, llama-cpp-draft, ..."""
    return "llama-cpp" if cfg.name == "plain" else f"llama-cpp-{cfg.name}"


LLAMA_ALL = "llama-cpp-all"  # every configuration in PEER_CONFIGS (the -md ones with --draft)


def make_llama_server(models: Models, opts: MethodOptions, cfg: PeerConfig = PEER_CONFIGS[0]):
    """llama-server on the target's GGUF in configuration `cfg` (with -md the draft's GGUF: llama.cpp's own
    speculative decoding), started now and stopped when the bench's process ends; a string saying why when it
    cannot run."""
    binary = find_binary("llama-server")
    if binary is None:
        return missing_binary("llama-server")
    target = peer_gguf(models.target)
    if target is None:
        return f"no GGUF file on disk for {models.target!r} (llama.cpp runs GGUF files: give --model a .gguf)"
    draft_gguf = peer_gguf(models.draft) if cfg.draft and models.draft else None
    if cfg.draft and draft_gguf is None:
        return f"no GGUF file on disk for the draft {models.draft!r} (give --draft a .gguf or a GGUF preset)"
    name = llama_method_name(cfg)
    try:
        server = LlamaServer(binary, cfg.server_config(target, draft_gguf, threads=opts.threads,
                                                       prompt_cache=opts.caches))
    except ForetellError as e:
        return str(e)
    info = build_info()
    print(f"foretell bench: {name}: {' '.join(server.command[1:])} ({info.get('build', 'unknown')} build "
          f"{' '.join(info.get('cmake_flags', []))})", file=sys.stderr)
    method = LlamaServerMethod(name, server, opts, models.pipeline().engine.stop_ids, info)
    method.peer["configuration"] = cfg.describe()
    return method


class LlamaCppPythonMethod:
    """llama-cpp-python, the Python binding (a Python loop per token), on the model's GGUF file: the peer of
    figures measured before the native binaries."""

    def __init__(self, gguf: Path, opts: MethodOptions, stop_ids: set[int]):
        # optional: llama-cpp-python, the bench's in-process peer (not a dependency)
        from llama_cpp import Llama

        self.name = "llama-cpp-python"
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

    def reset(self) -> None:
        pass  # generate(reset=True) starts every prompt afresh

    def memory_bytes(self) -> int:
        return self.gguf.stat().st_size  # weights only: llama.cpp's cache is not exposed


def make_llama_cpp_python(models: Models, opts: MethodOptions):
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install llama-cpp-python==0.3.36 builds it: minutes)"
    gguf = kept_gguf(models.target)
    if gguf is None:
        return f"no GGUF file on disk for {models.target!r}"
    return LlamaCppPythonMethod(gguf, opts, models.pipeline().engine.stop_ids)


HIDDEN_HOT_VOCAB = DEFAULT_HOT_VOCAB  # the hot-vocabulary size of the hidden-state methods
Build = Callable[[Models, MethodOptions], SpeculativeConfig]


@dataclass(frozen=True)
class MethodSpec:
    """A named foretell method: its configuration from the bench's files and options. `needs`: the Models
    field holding the drafter file it uses (draft, head, hidden_draft), None for none."""

    spec: Build
    help: str = ""
    needs: str | None = None


@dataclass(frozen=True)
class PeerSpec:
    """A peer (transformers, llama.cpp): build(models, options) -> a Method, or a string saying why it is
    unavailable (then skipped)."""

    build: Callable[[Models, MethodOptions], object]
    help: str = ""
    needs: str | None = None


def _draft(method: str, **options) -> Build:
    return lambda m, o: SpeculativeConfig(method=method, model=m.draft, hot_vocab=o.hot_vocab,
                                          draft_quant=m.draft_quant, **options)


def _chain(**options) -> Build:
    return lambda m, o: _draft("draft-model", gamma=o.gamma, **options)(m, o)


def _dynamic(o: MethodOptions, budget: int | None = None) -> TreeShape:
    return TreeShape(kind="dynamic", depth=o.tree_depth, top_k=o.tree_topk, total_tokens=budget or o.tree_budget)


def _head(**options) -> Build:
    return lambda m, o: SpeculativeConfig(method="parallel-head", model=m.head, hot_vocab=o.hot_vocab, **options)


def _eagle(**options) -> Build:
    return lambda m, o: SpeculativeConfig(method="eagle3", model=m.eagle, draft_quant=m.draft_quant, **options)


def _hidden(hot_vocab: int = HIDDEN_HOT_VOCAB, **options) -> Build:
    return lambda m, o: SpeculativeConfig(method="hidden-state", model=m.hidden_draft, hot_vocab=hot_vocab,
                                          draft_quant=m.draft_quant, **options)


HIDDEN_STATE_VARIANTS = (  # name, configuration, help suffix
    ("hidden-state", _hidden(), f" (--hidden-draft; {HIDDEN_HOT_VOCAB} hot tokens, token-info, resampling, fusion)"),
    ("hidden-state-full-vocab", _hidden(0), ", full vocabulary (ablation)"),
    ("hidden-state-no-info", _hidden(hidden=HiddenStateOptions(token_info=False)), " without token-info (ablation)"),
    ("hidden-state-no-resample", _hidden(hidden=HiddenStateOptions(resample=False)), " without resampling (ablation)"),
    ("hidden-state-no-fusion", _hidden(hidden=HiddenStateOptions(fuse=False)), " without verification fusion (ablation)"),
    ("hidden-state-auto", _hidden(budget="auto"), " with the adaptive scheduler (hardware-aware budget)"),
)

METHODS: dict[str, MethodSpec] = {
    "plain": MethodSpec(lambda m, o: SpeculativeConfig(method="none"), "foretell, no drafter (the baseline)"),
    "prompt-lookup": MethodSpec(lambda m, o: SpeculativeConfig(gamma=o.gamma), "foretell, n-gram prompt lookup"),
    "draft-chain": MethodSpec(_chain(), "foretell, draft model, chain of --gamma", "draft"),
    "draft-tree": MethodSpec(lambda m, o: _draft("draft-tree", tree=_dynamic(o))(m, o),
                             "foretell, draft model, EAGLE-2 dynamic tree (--tree-*)", "draft"),
    "draft-tree-static": MethodSpec(lambda m, o: _draft("draft-tree", tree=TreeShape(
        kind="static", branching=o.tree_branching))(m, o), "foretell, draft model, static top-k tree", "draft"),
    "draft-chain-auto": MethodSpec(_draft("draft-model", budget="auto"),
                                   "foretell, draft model, hardware-aware chain length", "draft"),
    "draft-chain-rejection": MethodSpec(_chain(length_policy="rejection-rate"),
                                        "foretell, draft model, recent-rejection-rate draft length (base --gamma)",
                                        "draft"),
    "draft-chain-additive": MethodSpec(_chain(length_policy="additive"),
                                       "foretell, draft model, transformers' +2/-1 draft length (base --gamma)", "draft"),
    # The tuner may pick any size up to the largest the sweep tries.
    "draft-tree-auto": MethodSpec(lambda m, o: _draft("draft-tree", budget="auto",
                                                      tree=_dynamic(o, max(o.tree_budget, 64)))(m, o),
                                  "foretell, dynamic tree, hardware-aware depth and size", "draft"),
    "parallel-head": MethodSpec(_head(), "foretell, parallel draft head tree (--head)", "head"),
    "parallel-head-auto": MethodSpec(_head(budget="auto"), "foretell, parallel head with the adaptive scheduler "
                                     "(budget, depth, width per step)", "head"),
    **{name: MethodSpec(build, f"foretell, hidden-state draft{what}", "hidden_draft")
       for name, build, what in HIDDEN_STATE_VARIANTS},
    "eagle3": MethodSpec(_eagle(), "foretell, EAGLE-3 head, EAGLE-2 dynamic tree (--eagle)", "eagle"),
    "eagle3-auto": MethodSpec(_eagle(budget="auto"), "foretell, EAGLE-3 head with the adaptive scheduler", "eagle"),
}

PEERS: dict[str, PeerSpec] = {
    "hf-plain": PeerSpec(lambda m, o: HFMethod("hf-plain", m, o), "transformers generate"),
    "hf-assisted": PeerSpec(lambda m, o: HFMethod("hf-assisted", m, o, assisted=True),
                            "transformers assisted generation (its own draft-length schedule)", "draft"),
    "hf-prompt-lookup": PeerSpec(lambda m, o: HFMethod("hf-prompt-lookup", m, o, prompt_lookup_num_tokens=o.gamma),
                                 "transformers prompt lookup (--gamma tokens)"),
    # llama.cpp's configurations (llama_server.PEER_CONFIGS): llama-cpp, llama-cpp-ngram, llama-cpp-draft[-...]
    **{llama_method_name(c): PeerSpec(lambda m, o, c=c: make_llama_server(m, o, c),
                                      "llama.cpp's own llama-server on the GGUF file, -np 1, --threads, "
                                      + c.describe().replace("DRAFT", "the draft's GGUF")
                                      + (f" (`{INSTALL_COMMAND}` builds it)" if c.name == "plain" else ""),
                                      "draft" if c.draft else None)
       for c in PEER_CONFIGS},
    "llama-cpp-python": PeerSpec(make_llama_cpp_python, "llama-cpp-python, the Python binding (older figures' "
                                 "peer), if installed"),
}

VARIANTS_HELP = ("M@N (the tree of at most N nodes), M-lookup (prompt lookup's match as one more tree branch), "
                 "M-cache (the result cache), M-lossy-T (LOSSY at threshold T), M-gate (the draft gate), "
                 "M-fp (the draft unquantized), for a foretell method M; combinable, e.g. hidden-state-lookup@8")
NEEDS_FLAG = {"draft": "--draft", "head": "--head", "hidden_draft": "--hidden-draft", "eagle": "--eagle"}


def variant_spec(name: str) -> MethodSpec | None:
    """A named method or a variant of one ('hidden-state-lookup@8', 'parallel-head-auto-lossy-0.9'); None
    when the name is neither. A variant is its base's configuration with one option changed."""
    if name in METHODS:
        return METHODS[name]
    base, change, what = _split_variant(name)
    spec = variant_spec(base) if base else None
    if spec is None:
        return None
    return replace(spec, spec=lambda m, o, build=spec.spec: change(build(m, o)), help=f"{spec.help}, {what}")


def _split_variant(name: str) -> tuple[str | None, Callable[[SpeculativeConfig], SpeculativeConfig] | None, str]:
    base, at, digits = name.rpartition("@")
    if at and digits.isdigit() and int(digits) >= 1:
        n = int(digits)
        return base, lambda s: s.with_tree(nodes=n), f"at most {n} nodes a pass"
    for suffix, option, value, what in (("-lookup", "result_cache", "prompt", "with prompt lookup's match as a branch"),
                                        ("-cache", "result_cache", "outputs", "with the result cache"),
                                        ("-gate", "draft_gate", True, "with the draft gate"),
                                        ("-fp", "draft_quant", "none", "full-precision draft")):
        if name.endswith(suffix):
            return name[: -len(suffix)], lambda s, o=option, v=value: replace(s, **{o: v}), what
    base, lossy, threshold = name.rpartition("-lossy-")
    if lossy:
        try:
            t = float(threshold)
        except ValueError:
            return None, None, ""
        return base, lambda s: replace(s, lossy_threshold=t), f"LOSSY at threshold {t:g}"
    return None, None, ""


def default_methods(has_draft: bool) -> list[str]:
    if has_draft:
        return ["plain", "prompt-lookup", "draft-chain", "draft-tree", "hf-plain", "hf-assisted"]
    return ["plain", "prompt-lookup", "hf-plain", "hf-prompt-lookup"]


def expand_llama_all(names: list[str], has_draft: bool, warn=print) -> list[str]:
    """LLAMA_ALL in a method list -> every llama.cpp configuration (the -md ones only with a draft model)."""
    if LLAMA_ALL not in names:
        return names
    if not has_draft:
        warn(f"foretell bench: {LLAMA_ALL} without --draft: no llama-server -md configurations")
    every = [llama_method_name(c) for c in PEER_CONFIGS if has_draft or not c.draft]
    out: list[str] = []
    for n in names:
        out += [m for m in every if m not in names and m not in out] if n == LLAMA_ALL else [n]
    return out


def has_llama_peer(names: list[str]) -> bool:
    """Whether a method list runs llama.cpp's llama-server (then each side's best is reported, from --runs)."""
    return any(n == LLAMA_ALL or n in PEERS and n.startswith("llama-cpp") and n != "llama-cpp-python" for n in names)


def build_methods(names: list[str], models: Models, opts: MethodOptions, warn=print,
                  configs: dict[str, SpeculativeConfig] | None = None) -> list:
    """Methods in the given order, then one per configuration in `configs` (name -> config, from
    --spec-config files). Every configuration is checked before any weights load; unavailable peers are
    skipped with a message via `warn`."""
    configs = dict(configs or {})
    names = expand_llama_all(names, bool(models.draft), warn)
    clash = sorted(set(configs) & set(names))
    if clash:
        raise ForetellError(f"--spec-config name(s) {', '.join(clash)} repeat a method name; rename them")
    specs = {n: PEERS.get(n) or variant_spec(n) for n in names}
    unknown = [n for n, spec in specs.items() if spec is None]
    if unknown:
        raise ForetellError(f"unknown method(s) {', '.join(unknown)}; use {', '.join([*METHODS, *PEERS])}, or "
                            f"{VARIANTS_HELP}")
    for need, flag in NEEDS_FLAG.items():
        needing = [n for n, spec in specs.items() if spec.needs == need]
        if needing and not getattr(models, need):
            raise ForetellError(f"method(s) {', '.join(needing)} need {flag}")
    resolved = {n: spec.spec(models, opts) for n, spec in specs.items() if isinstance(spec, MethodSpec)}
    resolved.update(configs)
    built = []
    for n in [*names, *configs]:
        if n in resolved:
            built.append(ForetellMethod(n, models.pipeline(), resolved[n], opts))
            continue
        method = specs[n].build(models, opts)
        if isinstance(method, str):
            warn(f"foretell bench: skipping {n}: {method}")
        else:
            built.append(method)
    return built
