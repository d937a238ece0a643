"""The engine: a target, a drafter and its policies, and the decode loop of one request at a time.

The loop is prefill -> propose -> verify -> commit -> stream; its steps live in decoding.py (Decoding), so
a batching driver runs the very same steps for many requests at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from foretell.decoding import Decoding, RequestContext
from foretell.drafters.base import Drafter
from foretell.errors import ForetellError
from foretell.grammar import compiler_for
from foretell.logits_process import LogitsProcessor
from foretell.lossy import check_lossy_threshold, verifier_for
from foretell.models.transformer import Transformer, warm_up
from foretell.prefix_cache import PrefixCache
from foretell.result_cache import ResultCache
from foretell.sizing.chain import DraftLengthPolicy, FixedLength
from foretell.sizing.gate import DraftGate
from foretell.sizing.request import SizingPolicies
from foretell.types import Chunk, GenerationResult, SamplingParams
from foretell.verify import Verifier


@dataclass
class Engine:
    target: Transformer
    tokenizer: object
    stop_ids: set[int]
    drafter: Drafter | None = None
    # A chain drafter's draft length; each request sizes with a copy of it (sizing/request.py): this one never
    # changes.
    length_policy: DraftLengthPolicy = field(default_factory=FixedLength)
    max_draft: int = 16  # upper bound on draft tokens a policy may ask for
    # Opt-in, both off by default: LOSSY verification (lossy.py: a draft path probability above
    # the threshold skips the target's check) and the result cache (result_cache.py).
    lossy_threshold: float | None = None
    result_cache: ResultCache | None = None
    # Hardware-aware, lossless: whether a tree drafter runs at all each pass (sizing/gate.py).
    draft_gate: DraftGate | None = None

    def __post_init__(self):
        self.lossy_threshold = check_lossy_threshold(self.lossy_threshold)
        name = self.drafter.name if self.drafter is not None else "none"
        for extra, why in ((self.draft_gate, "the draft gate skips passes of"),
                           (self.result_cache, "the result cache merges its branch into a tree proposal, so it needs")):
            if extra is not None and not (self.drafter is not None and self.drafter.sizes_itself):
                raise ForetellError(f"{why} a tree drafter (draft-tree, parallel-head, hidden-state), not {name}")

    @property
    def context_window(self) -> int:
        return self.target.config.context_window

    def generate(self, prompt_ids: list[int], params: SamplingParams,
                 prefix_cache: PrefixCache | None = None) -> GenerationResult:
        for chunk in self.stream(prompt_ids, params, prefix_cache):
            if chunk.result is not None:
                return chunk.result
        raise AssertionError("stream ended without a result")

    def warm_up(self, sizes: tuple[int, ...] = (1, 2, 3, 4, 5)) -> None:
        """Throw-away forwards of the shapes decoding uses: the first call of each shape pays
        for page-ins of fresh weights and kernel set-up, which would otherwise land in the
        first generation's timings."""
        sizes = (*sizes, self.max_proposal + 1)
        with torch.inference_mode():
            warm_up(self.target, sorted(set(sizes)))
        if self.drafter is not None:
            self.drafter.warm_up()

    def stream(self, prompt_ids: list[int], params: SamplingParams,
               prefix_cache: PrefixCache | None = None) -> Iterator[Chunk]:
        """Decode one request alone: prefill, then plan -> target pass -> settle until it finishes (prefix_cache: a
        prefix_cache.PrefixCache its prompt may start from and is kept in, or None)."""
        with torch.inference_mode():
            state = Decoding(self.context(prompt_ids, params), prompt_ids, params, prefix_cache)
            if state.prefilling:
                step = state.prefill_pass()
                state.prefilled_pass(step, step.run(self.target))
            while not state.done:
                yield state.settle(state.plan().run(self.target))

    def start(self, prompt_ids: list[int], params: SamplingParams,
              prefix_cache: PrefixCache | None = None) -> Decoding:
        """A request's decoding state under this engine's configuration, for a driver that runs many at once
        (prefix_cache: the driver's prefix_cache.PrefixCache, or None)."""
        return Decoding(self.context(prompt_ids, params), prompt_ids, params, prefix_cache)

    @property
    def drafter_layers(self) -> tuple[int, ...]:
        """Target hidden layers the drafter reads; () costs nothing extra."""
        return self.drafter.target_layers if self.drafter is not None else ()

    @property
    def max_proposal(self) -> int:
        """The largest proposal the drafter declares (tree nodes); 0 = bounded by max_draft."""
        return self.drafter.max_nodes if self.drafter is not None else 0

    def context(self, prompt_ids: list[int], params: SamplingParams) -> RequestContext:
        """What a request's decoding uses of this engine, taken once (decoding.RequestContext)."""
        return RequestContext(
            target=self.target, tokenizer=self.tokenizer, stop_ids=frozenset(self.stop_ids), drafter=self.drafter,
            verifier=self.verifier, processor=self.logits_processor(prompt_ids, params),
            sizing=self.sizing_policies(), max_draft=self.max_draft, max_proposal=self.max_proposal,
            drafter_layers=self.drafter_layers, result_cache=self.result_cache)

    def sizing_policies(self) -> SizingPolicies:
        branch = self.result_cache.sizer if self.result_cache is not None else None
        return SizingPolicies(self.length_policy, self.max_draft, self.draft_gate, branch)

    def logits_processor(self, prompt_ids: list[int], params: SamplingParams):
        """The request's logits processing (logits_process.py), or None when it leaves the logits as they are."""
        if not params.processes_logits:
            return None

        grammar = None
        if params.response_format is not None:
            grammar = self.grammar_compiler().matcher(params.response_format)
        return LogitsProcessor(params, prompt_ids, self.target.config.vocab_size, self.target.device, grammar)

    def grammar_compiler(self):
        """The tokenizer's response_format compiler (grammar.py), made on first use."""
        return compiler_for(self.tokenizer, self.target.config.vocab_size, self.stop_ids)

    @property
    def verifier(self) -> Verifier:
        """The verification strategy: lossless `verify` unless the opt-in lossy mode is on (lossy.py)."""
        return verifier_for(self.lossy_threshold)
