"""The composition root: from a SpeculativeConfig to a drafter, its sizing and the engine around them.

The one place that turns configuration into objects, for the Python API, the CLI, the bench and the server; it
sits above the engine and below the api (tests/test_layers.py). Drafter weights come from a DrafterWeights store, so
several configurations over one target (the bench's methods) load each draft model, head or hidden-state draft
once; the machine's cost curve is measured here for the sizing policies (build_sizing), not by the drafters.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from foretell.config import GGUF_DRAFT_QUANTS, HEAD_METHODS, HeadTreeShape, SpeculativeConfig
from foretell.drafters.base import Drafter
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.draft_tree import DraftTreeDrafter
from foretell.drafters.eagle_tree import Eagle3Drafter
from foretell.drafters.hidden_tree import DEFAULT_HOT_VOCAB, HiddenStateDrafter
from foretell.drafters.parallel_tree import ParallelHeadDrafter
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.engine import Engine
from foretell.errors import ForetellError
from foretell.hot_vocab import HotVocab, default_hot_vocab
from foretell.kernels import cpu_class
from foretell.models.eagle3 import Eagle3Head
from foretell.models.eagle3_format import load_eagle3_head
from foretell.models.hidden_draft import installed_hidden_draft, load_hidden_draft
from foretell.models.parallel_head import ParallelHead, load_parallel_head
from foretell.models.shipped import (
    MANIFEST, SHIPPED_DIR, default_shipped, resolve_corpus, resolve_drafter_folder, shipped_manifests, verified_folder,
)
from foretell.result_cache import make_result_cache
from foretell.runtime.config import RuntimeConfig
from foretell.runtime.gguf_quant import check_replaced, replaced_weights
from foretell.runtime.loading import LoadedModel, kept_gguf, load_model
from foretell.runtime.prepare import drafter_runtime, prepare
from foretell.sizing.chain import DraftLengthPolicy, HardwareAwareLength, make_length_policy
from foretell.sizing.cost import CostCurve, cost_curve
from foretell.sizing.gate import DraftGate
from foretell.sizing.tree import AdaptiveTreeScheduler, LevelBudget
from foretell.text import stop_token_ids


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Speculation compares token ids, so the two vocabularies must be identical."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv or target_tok.eos_token_id != draft_tok.eos_token_id:
        differing = len(set(tv.items()) ^ set(dv.items()))
        raise ForetellError(
            f"draft {draft_name!r} and target {target_name!r} use different tokenizers "
            f"({len(dv)} vs {len(tv)} tokens, {differing} entries differ); pick a draft from the target's family"
        )


@dataclass
class DrafterWeights:
    """Drafter weights for one loaded target, each loaded on first use and kept for the next configuration.

    Keys include what changes the weights: the quantization mode (int8 rewrites a module in place) and the
    hot-vocabulary size (it slices the output layer).
    """

    target: LoadedModel
    target_name: str
    dtype: str | torch.dtype = "float32"
    device: str = "cpu"
    cache_dir: Path | None = None
    shipped_root: Path | None = None  # where shipped drafters are looked up by name (None: the package's own)
    # the target is a bf16 model run as float32 activations (lean_step.run_bf16_as_float32): drafters' weights are
    # rounded to bf16 numbers, as on a bf16 target, which the lean kernels stream as bf16 (half the bytes)
    bf16_numbers: bool = False
    _loaded: dict = field(default_factory=dict, repr=False)

    def _once(self, key, make):
        if key not in self._loaded:
            self._loaded[key] = make()
        return self._loaded[key]

    def draft_model(self, spec: str, quant: str) -> LoadedModel:
        """A draft model: a folder, a preset, or a shipped draft model's name (its checksums and target checked)."""
        def make():
            root = self.shipped_root or SHIPPED_DIR
            shipped = not Path(spec).exists() and (root / spec / MANIFEST).is_file()
            where = str(verified_folder(spec, "draft-model", self.target.model, root)) if shipped else spec
            runtime = self._gguf_draft_runtime(where, quant) if quant in GGUF_DRAFT_QUANTS else None
            skipped = replaced_weights(runtime.gguf_file) if runtime is not None else frozenset()
            draft = load_model(where, self.dtype, self.device, self.cache_dir, skipped)
            check_same_tokenizer(self.target.tokenizer, draft.tokenizer, self.target_name, spec)
            if runtime is not None:  # its file's blocks, its steps in the lean step as a target's
                prepared = prepare(draft.model, runtime)
                check_replaced(draft.model, skipped)
                if prepared.lean is not None:
                    raise ForetellError(f"--draft-quant {quant} runs the draft in foretell's lean step, and "
                                        f"{prepared.lean}; use --draft-quant auto")
                return draft
            # its weights per `quant`; bf16 on a CPU without native bf16 matmul: wide passes in fp32 (measured here)
            prepare(draft.model, RuntimeConfig(device=self.device, dtype=self.dtype, quant=quant, bf16_as_float32=False,
                                               lean=False))
            return draft

        return self._once(("draft-model", spec, quant), make)

    def _gguf_draft_runtime(self, where: str, quant: str) -> RuntimeConfig:
        """How a draft model runs its GGUF file's blocks (gguf, gguf-q8), checked before anything loads."""
        gguf = kept_gguf(where, self.cache_dir)
        if gguf is None:
            raise ForetellError(f"--draft-quant {quant} runs a draft model's GGUF blocks, and {where!r} has no GGUF file "
                                "on disk; use --draft-quant auto")
        if str(self.dtype).removeprefix("torch.") != "float32" or str(self.device) != "cpu":
            raise ForetellError(f"--draft-quant {quant} runs in foretell's lean step: a float32 CPU model, not "
                                f"{self.dtype} on {self.device}; use --dtype float32, or --draft-quant auto")
        return RuntimeConfig(device=self.device, dtype="float32", quant="gguf", gguf_file=gguf,
                             activations="q8" if quant == "gguf-q8" else "float", bf16_as_float32=False)

    def stop_ids(self) -> set[int]:
        """The target's end tokens, found once: a server builds an engine per request, and reading the tokenizer's
        whole vocabulary cost each one ~5% of a single stream's time."""
        return set(self._once(("stop-ids",), lambda: frozenset(stop_token_ids(self.target.tokenizer,
                                                                                self.target.config.eos_token_ids))))

    def hot_vocab(self, size: int, draft: LoadedModel | None = None) -> HotVocab | None:
        """The hot vocabulary for a drafter (None when size is 0 or covers the whole vocabulary); `draft`
        for a draft model, whose vocabulary may be shorter than the target's."""
        full = min(self.target.config.vocab_size, (draft or self.target).config.vocab_size)
        if size == 0 or size >= full:
            return None

        def make():
            hot = default_hot_vocab(self.target.tokenizer, size, full, self.cache_dir)  # ids valid in both
            return HotVocab(hot.ids, self.target.config.vocab_size)

        return self._once(("hot", size, full), make)

    def folder(self, model: str, method: str) -> Path:
        """A head's or hidden-state draft's folder: `model` itself, or the shipped drafter of that name (its
        checksums and target checked once)."""
        root = self.shipped_root or SHIPPED_DIR
        model = model or self.shipped_name(method)
        return self._once(("folder", model, method), lambda: resolve_drafter_folder(model, method, self.target.model, root))

    def shipped_name(self, method: str) -> str:
        """The shipped drafter of kind `method` for this target (its default first), for a head method given
        without weights. Read once: a server builds an engine for every request, and the manifests are files
        (~5 ms a request)."""
        def find() -> str:
            mine = [m for m in shipped_manifests(self.shipped_root or SHIPPED_DIR)
                    if m.kind == method and m.target.name == self.target_name]
            if not mine:
                flag = {"parallel-head": "--head", "hidden-state": "--hidden-draft", "eagle3": "--eagle"}[method]
                raise ForetellError(f"no {method} drafter is shipped for {self.target_name}: give its folder with "
                                    f"{flag} (train one: docs/training.md)")
            return max(mine, key=lambda m: m.default).name

        return self._once(("shipped", method), find)

    def corpus(self, name: str | None):
        """A corpus of the target's own answers (a file, or a shipped corpus's name: checked), None for None."""
        if name is None:
            return None
        root = self.shipped_root or SHIPPED_DIR
        return self._once(("corpus", name), lambda: resolve_corpus(name, self.target.model, root))

    def parallel_head(self, model: str, hot_vocab: int, quant: str = "none"):
        """A parallel head: a folder or a shipped name; int8 per `quant` (ParallelHead.quantize), where "auto" is
        int8 on a target with 8-bit activations only (with them, a float32 head's layer was most of its draft pass
        on Qwen2.5-Coder-1.5B: 24.8 ms a pass, 11.2 ms as int8, docs/generalisation.md); elsewhere its weights
        stay as saved, or as bf16 numbers (`ready`)."""
        lean = self.target.model.lean
        if quant == "auto" and not (lean is not None and lean.act_q8):
            quant = "none"
        folder = self.folder(model, "parallel-head")
        return self._once(("head", folder, hot_vocab, quant), lambda: self.ready(
            load_parallel_head(folder, self.target.model, self.hot_vocab(hot_vocab)), quant))

    def hidden_draft(self, model: str, hot_vocab: int, quant: str):
        folder = self.folder(model, "hidden-state")
        return self._once(("hidden", folder, hot_vocab, quant), lambda: self.ready(
            load_hidden_draft(folder, self.target.model, self.hot_vocab(hot_vocab)), quant))

    def eagle3_head(self, model: str, quant: str = "none"):
        """An EAGLE-3 head: foretell's folder, an EAGLE-3 checkpoint in the engines' layout, or a shipped name;
        int8 per `quant` (Eagle3Head.quantize)."""
        folder = self.folder(model, "eagle3")
        return self._once(("eagle3", folder, quant),
                          lambda: self.ready(load_eagle3_head(folder, self.target.model), quant))

    def ready(self, module, quant: str | None = None):
        """A loaded head or hidden-state draft made ready to draft on this target: its float32 parameters rounded to
        bf16 numbers where bf16_numbers says the target's are (a head trained and saved in float32 then drafts at
        the shipped bf16 heads' cost, not about twice it; a drafter only proposes, so this can move acceptance,
        never exactness), quantized per `quant`, then on the target's wide-pass and lean-step paths (runtime/prepare.py:
        drafter_runtime). Where the target has 8-bit activations, an EAGLE-3 head's or a parallel head's int8
        projections take them too."""
        runtime = drafter_runtime(self.target.model, self.device, self.dtype, quant, self.bf16_numbers,
                                  q8=isinstance(module, (Eagle3Head, ParallelHead)))
        return prepare(module, runtime).module

    def target_cost(self) -> CostCurve:
        """The target's forward cost by verified tokens on this machine (measured once, then cached on disk)."""
        return self._once(("cost", "target"), lambda: cost_curve(self.target.model, self.target_name, self.cache_dir))

    def draft_step_seconds(self, spec: str, quant: str) -> float:
        model = self.draft_model(spec, quant).model
        return self._once(("cost", spec, quant), lambda: cost_curve(model, spec, self.cache_dir))(1)


@dataclass(frozen=True)
class Sizing:
    """How a configuration sizes its drafts (sizing/): a chain drafter's length policy; with budget auto, a tree
    drafter's adaptive schedule or a draft tree's level budget. The target's cost curve is measured (or read from
    the cache) here, once per DrafterWeights, never by a drafter."""

    length_policy: DraftLengthPolicy
    scheduler: AdaptiveTreeScheduler | None = None
    level_budget: LevelBudget | None = None


def build_sizing(spec: SpeculativeConfig, weights: DrafterWeights) -> Sizing:
    policy = make_length_policy(spec.length_policy, spec.gamma)
    if spec.budget != "auto" or spec.method in ("none", "prompt-lookup"):
        return Sizing(policy)
    if spec.method == "draft-model":
        draft_step = weights.draft_step_seconds(spec.model, spec.draft_quant)  # loads (and checks) the draft first
        return Sizing(HardwareAwareLength(weights.target_cost(), draft_step, max_gamma=12))
    if spec.method == "draft-tree":
        return Sizing(policy, level_budget=LevelBudget(weights.target_cost()))
    return Sizing(policy, scheduler=AdaptiveTreeScheduler(weights.target_cost()))


def build_drafter(spec: SpeculativeConfig, weights: DrafterWeights, sizing: Sizing) -> Drafter | None:
    """The drafter a configuration describes (None for method none), sized by `sizing` where it sizes itself."""
    vocab_size = weights.target.config.vocab_size
    if spec.method == "none":
        return None
    if spec.method == "prompt-lookup":
        return PromptLookupDrafter(spec.lookup_max, spec.lookup_min, weights.corpus(spec.corpus))
    if spec.method in ("draft-model", "draft-tree"):
        draft = weights.draft_model(spec.model, spec.draft_quant)
        hot = weights.hot_vocab(spec.hot_vocab, draft)
        if spec.method == "draft-model":
            return DraftModelDrafter(draft.model, vocab_size, hot)
        return DraftTreeDrafter(draft.model, vocab_size, spec.tree, sizing.level_budget, hot)
    if spec.method == "parallel-head":
        head = weights.parallel_head(spec.model, spec.hot_vocab, spec.draft_quant)
        shape = spec.head_tree or HeadTreeShape(depth=min(HeadTreeShape().depth, head.config.depth))
        return ParallelHeadDrafter(head, shape, sizing.scheduler)
    if spec.method == "eagle3":
        return Eagle3Drafter(weights.eagle3_head(spec.model, spec.draft_quant), spec.eagle_tree, sizing.scheduler)
    draft = weights.hidden_draft(spec.model, spec.hot_vocab, spec.draft_quant)
    return HiddenStateDrafter(draft, spec.hidden, sizing.scheduler)


def with_shipped_model(spec: SpeculativeConfig, weights: DrafterWeights) -> SpeculativeConfig:
    """`spec` with its weights named: a head method given without them gets the target's shipped drafter of that
    kind, so the configuration a pipeline reports (and saves) says which drafter ran."""
    if spec.method in HEAD_METHODS and not spec.model:
        return replace(spec, model=weights.shipped_name(spec.method))
    return spec


def build_engine(spec: SpeculativeConfig, weights: DrafterWeights) -> Engine:
    """The engine a configuration describes: the target, its drafter, the drafts' sizing and the verifier's
    settings (lossy threshold), the result cache and the draft gate."""
    sizing = build_sizing(spec, weights)
    drafter = build_drafter(spec, weights, sizing)
    target = weights.target
    return Engine(
        target=target.model,
        tokenizer=target.tokenizer,
        stop_ids=weights.stop_ids(),
        drafter=drafter,
        length_policy=sizing.length_policy,
        lossy_threshold=spec.lossy_threshold,
        result_cache=make_result_cache(spec.result_cache,
                                      weights.corpus(spec.corpus) if spec.method != "prompt-lookup" else None),
        draft_gate=DraftGate() if spec.draft_gate else None,
    )


def default_speculative(target: str | Path, cache_dir: Path | None = None, shipped_root: Path | None = None,
                        device: str = "cpu") -> tuple[SpeculativeConfig, str]:
    """The configuration used when none is given, and why, in this order: the target's installed hidden-state
    draft (`foretell train hidden-state --install`: the user's own choice), the shipped drafter that is its default
    (the fastest shipped one in the bench on this class of CPU, kernels.cpu_class, where one was measured), else
    prompt lookup."""
    folder = installed_hidden_draft(str(target), cache_dir)
    if folder is not None:
        return (SpeculativeConfig(method="hidden-state", model=str(folder), budget="auto", hot_vocab=DEFAULT_HOT_VOCAB,
                                  result_cache="prompt"), f"the installed hidden-state draft {folder}")
    cpu = cpu_class() if str(device) == "cpu" else None
    shipped = default_shipped(str(target), shipped_root or SHIPPED_DIR, cpu)
    if shipped is not None:
        where = f" on {cpu.upper()} CPUs like this one" if cpu in shipped.default_on else ""
        why = f"the shipped drafter {shipped.name}, the fastest in foretell's benchmark for this target{where}"
        return shipped.speculative_config(), why
    # n-grams of 2 or more: a 1-token match's drafts were accepted 0.29 of the time at depth 1 on Qwen2.5-Coder-1.5B
    # and cost more verification than they returned (0.97x plain; 2-3-token matches 1.05x; docs/speed.md)
    return (SpeculativeConfig(method="prompt-lookup", lookup_min=2),
            "no trained drafter shipped or installed for this target; prompt lookup on n-grams of 2 or more")
