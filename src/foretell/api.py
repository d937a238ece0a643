"""The Python API: `load` a target (and drafter), then `generate` or `stream`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch

from foretell.budget import HardwareAwareLength, cost_curve
from foretell.draft_gate import DraftGate
from foretell.drafters.base import Drafter
from foretell.drafters.draft_model import DraftModelDrafter
from foretell.drafters.draft_tree import DraftTreeDrafter, TreeShape
from foretell.drafters.hidden_tree import HiddenStateDrafter, HiddenStateOptions
from foretell.drafters.length_policy import DraftLengthPolicy, make_length_policy
from foretell.drafters.parallel_tree import HeadTreeShape, ParallelHeadDrafter
from foretell.drafters.tree_scheduler import AdaptiveTreeScheduler
from foretell.drafters.prompt_lookup import PromptLookupDrafter
from foretell.engine import Chunk, Engine, GenerationResult
from foretell.errors import ForetellError
from foretell.lossy import check_lossy_threshold
from foretell.hot_vocab import HotVocab, default_hot_vocab
from foretell.models.hidden_draft import load_hidden_draft
from foretell.models.loading import LoadedModel, load_model
from foretell.models.parallel_head import load_parallel_head
from foretell.models.quant import apply_quant
from foretell.result_cache import make_result_cache
from foretell.text import encode_prompt, stop_token_ids
from foretell.types import SamplingParams

DRAFTERS = ("none", "draft-model", "draft-tree", "prompt-lookup", "parallel-head", "hidden-state")


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Speculation compares token ids, so the two vocabularies must be identical."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv or target_tok.eos_token_id != draft_tok.eos_token_id:
        differing = len(set(tv.items()) ^ set(dv.items()))
        raise ForetellError(
            f"draft {draft_name!r} and target {target_name!r} use different tokenizers "
            f"({len(dv)} vs {len(tv)} tokens, {differing} entries differ); pick a draft from the target's family"
        )


def draft_hot_vocab(target: LoadedModel, draft: LoadedModel, size: int, cache_dir: Path | None = None):
    """The hot vocabulary for a draft (None when size is 0 or covers the whole vocabulary)."""
    if size < 0:
        raise ForetellError(f"hot_vocab must be >= 0 (0 = full vocabulary), got {size}")
    full = min(target.config.vocab_size, draft.config.vocab_size)
    if size == 0 or size >= full:
        return None
    hot = default_hot_vocab(target.tokenizer, size, full, cache_dir)  # ids valid in both vocabularies
    return HotVocab(hot.ids, target.config.vocab_size)


@dataclass
class Pipeline:
    target: LoadedModel
    engine: Engine
    draft: LoadedModel | None = None

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat)

    def stream(self, prompt: str | list[dict], chat: bool = True, **sampling) -> Iterator[Chunk]:
        """Yield text as it is produced; the last chunk carries the full result and statistics."""
        return self.engine.stream(self.encode(prompt, chat), SamplingParams(**sampling))

    def generate(self, prompt: str | list[dict], chat: bool = True, **sampling) -> GenerationResult:
        return self.engine.generate(self.encode(prompt, chat), SamplingParams(**sampling))

    def with_drafter(
        self, drafter: Drafter | None, length_policy: str | DraftLengthPolicy = "fixed", gamma: int = 4
    ) -> "Pipeline":
        """The same models with another drafter (shares weights; handy for comparisons).

        length_policy: a policy name (see make_length_policy) or a policy object. The draft gate,
        whose measurements belong to the old drafter, is dropped (add one with replace()).
        """
        if isinstance(length_policy, str):
            length_policy = make_length_policy(length_policy, gamma)
        return replace(self, engine=replace(self.engine, drafter=drafter, length_policy=length_policy, draft_gate=None))


def load(
    target: str | Path = "smollm2-135m",
    draft: str | Path | None = None,
    drafter: str | None = None,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    gamma: int = 4,
    length_policy: str = "fixed",
    tree: TreeShape | None = None,
    auto_budget: bool = False,
    hot_vocab: int = 0,
    draft_quant: str = "none",
    warm_up: bool = True,
    cache_dir: Path | None = None,
    head: str | Path | None = None,
    head_tree: HeadTreeShape | None = None,
    hidden_draft: str | Path | None = None,
    hidden_options: HiddenStateOptions | None = None,
    lossy_threshold: float | None = None,
    result_cache: bool | str | None = False,
    draft_gate: bool = False,
) -> Pipeline:
    """Load a target and a drafter: none | draft-model | draft-tree (both need `draft`) | prompt-lookup
    | parallel-head (needs `head`).

    Without `drafter`, a given `draft` means draft-model, otherwise prompt-lookup. `tree`
    shapes the draft-tree drafter (default: an EAGLE-2 style dynamic tree). `auto_budget`
    measures the target's forward cost curve on this machine (once, then cached) and picks the
    draft length (chain) or tree depth and size (dynamic tree) maximising expected tokens/s.
    `hot_vocab` > 0 restricts the draft's output layer to that many frequent tokens (lossless).
    `draft_quant` "int8" stores the draft's projections as int8 (2-3x faster draft steps on
    CPU; lossless: only acceptance can change); "auto" means int8 on CPU, none elsewhere. It
    applies to a draft model and to the hidden-state draft's own layer.
    `warm_up` runs a few throw-away forwards so the first generation is not the slow one.
    `head` is a saved parallel head folder for the parallel-head drafter (the default drafter
    when it is given), `head_tree` its tree budget (default 16 nodes, depth 4, width 3); with
    `auto_budget` the adaptive scheduler picks each step's budget, depth and width instead.
    `hidden_draft` is a saved hidden-state draft folder for the hidden-state drafter (seed 000;
    the default drafter when it is given), `hidden_options` its tree and ablation switches; with
    `auto_budget` the adaptive scheduler picks each step's budget (up to 64 nodes).
    `draft_gate` (tree drafters; lossless, off by default: about even overall in our benchmarks)
    decides before each pass, from measured tokens per second, whether drafting pays at all; when
    not, the pass verifies only the result cache's branch, or nothing (draft_gate.py).
    `lossy_threshold` (opt-in, LOSSY: the output no longer follows the target exactly): a draft
    token whose draft path probability exceeds it is accepted without the target's check; in (0, 1].
    `result_cache` (lossless) offers continuations committed earlier (this and previous requests)
    as an extra branch of a tree drafter's proposal; "prompt" searches the prompt too (prompt lookup
    merged into the tree).
    """
    drafter = drafter or (
        "draft-model" if draft else "parallel-head" if head else "hidden-state" if hidden_draft else "prompt-lookup"
    )
    if drafter not in DRAFTERS:
        raise ForetellError(f"unknown drafter {drafter!r}; use one of {', '.join(DRAFTERS)}")
    if drafter in ("draft-model", "draft-tree") and not draft:
        raise ForetellError(f"the {drafter} drafter needs a draft model: pass draft=... (CLI: --draft)")
    if (drafter == "parallel-head") != (head is not None):
        raise ForetellError("the parallel-head drafter needs head=PATH (CLI: --head), and head is only for that drafter")
    if (drafter == "hidden-state") != (hidden_draft is not None):
        raise ForetellError(
            "the hidden-state drafter needs hidden_draft=PATH (CLI: --hidden-draft), and hidden_draft is only for that drafter"
        )
    lossy_threshold = check_lossy_threshold(lossy_threshold)
    if lossy_threshold is not None and drafter in ("none", "prompt-lookup"):
        raise ForetellError(
            f"lossy_threshold needs a drafter with draft probabilities (draft-model, draft-tree, parallel-head, "
            f"hidden-state); the {drafter} drafter has none"
        )
    the_result_cache = make_result_cache(result_cache)  # checks the mode before any loading
    for option, on in (("draft_gate", draft_gate), ("result_cache", the_result_cache is not None)):
        if on and drafter not in ("draft-tree", "parallel-head", "hidden-state"):
            raise ForetellError(f"{option} needs a tree drafter (draft-tree, parallel-head, hidden-state), not {drafter}")
    if not 1 <= gamma <= 16:
        raise ForetellError(f"gamma (draft length) must be between 1 and 16, got {gamma}")
    tgt = load_model(target, dtype, device, cache_dir)
    policy = make_length_policy(length_policy, gamma)
    drf = None
    the_drafter: Drafter | None = None
    if drafter in ("draft-model", "draft-tree"):
        drf = load_model(draft, dtype, device, cache_dir)
        check_same_tokenizer(tgt.tokenizer, drf.tokenizer, str(target), str(draft))
        apply_quant(drf.model, draft_quant)
        target_cost = cost_curve(tgt.model, str(target), cache_dir) if auto_budget else None
        hot = draft_hot_vocab(tgt, drf, hot_vocab, cache_dir)
        if drafter == "draft-model":
            the_drafter = DraftModelDrafter(drf.model, tgt.config.vocab_size, hot)
            if target_cost is not None:
                draft_step = cost_curve(drf.model, str(draft), cache_dir)(1)
                policy = HardwareAwareLength(target_cost, draft_step, max_gamma=12)
        else:
            the_drafter = DraftTreeDrafter(drf.model, tgt.config.vocab_size, tree or TreeShape(), target_cost, hot)
    elif drafter == "prompt-lookup":
        the_drafter = PromptLookupDrafter()
    elif drafter == "parallel-head":
        hot = draft_hot_vocab(tgt, tgt, hot_vocab, cache_dir)  # the head shares the target's output layer
        parallel_head = load_parallel_head(head, tgt.model, hot)
        # Default tree: as deep as the head drafts, up to the default depth.
        shape = head_tree or HeadTreeShape(depth=min(HeadTreeShape().depth, parallel_head.config.depth))
        scheduler = AdaptiveTreeScheduler(cost_curve(tgt.model, str(target), cache_dir)) if auto_budget else None
        the_drafter = ParallelHeadDrafter(parallel_head, shape, scheduler)
    elif drafter == "hidden-state":
        hot = draft_hot_vocab(tgt, tgt, hot_vocab, cache_dir)  # the draft shares the target's output layer
        scheduler = AdaptiveTreeScheduler(cost_curve(tgt.model, str(target), cache_dir)) if auto_budget else None
        the_drafter = HiddenStateDrafter(load_hidden_draft(hidden_draft, tgt.model, hot).quantize(draft_quant),
                                         hidden_options or HiddenStateOptions(), scheduler)
    if auto_budget and drafter not in ("draft-model", "draft-tree", "parallel-head", "hidden-state"):
        raise ForetellError("auto_budget needs a draft-model, draft-tree, parallel-head or hidden-state drafter")
    if draft_quant not in ("none", "auto") and drafter not in ("draft-model", "draft-tree", "hidden-state"):
        raise ForetellError("draft_quant needs a draft-model, draft-tree or hidden-state drafter")
    if hot_vocab and drafter not in ("draft-model", "draft-tree", "parallel-head", "hidden-state"):
        raise ForetellError("hot_vocab needs a draft-model, draft-tree, parallel-head or hidden-state drafter")
    engine = Engine(
        target=tgt.model,
        tokenizer=tgt.tokenizer,
        stop_ids=stop_token_ids(tgt.tokenizer, tgt.config.eos_token_ids),
        drafter=the_drafter,
        length_policy=policy,
        lossy_threshold=lossy_threshold,
        result_cache=the_result_cache,
        draft_gate=DraftGate() if draft_gate else None,
    )
    if warm_up:
        engine.warm_up()
    return Pipeline(tgt, engine, drf)
