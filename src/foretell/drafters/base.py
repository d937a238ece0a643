"""The protocol every drafter implements. Drafters propose; they never verify.

Capabilities the engine relies on are declared here, with defaults in DrafterBase, so the engine reads
them directly instead of probing for optional attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generator, Protocol

import torch

from foretell.coupled import GumbelNoise
from foretell.runtime.lean_step import lean_forward
from foretell.types import Proposal, SamplingParams

if TYPE_CHECKING:
    from foretell.sizing.tree import AdaptiveTreeScheduler


class Drafter(Protocol):
    """What the engine calls, in order: start and couple, then per pass propose -> (verification) -> verified ->
    observe.

    name: shown in statistics and logs.
    sizes_itself: True when the drafter picks its own depth and size (trees); the engine's length policy
        then does not apply, and `max_tokens` of propose only caps the depth.
    max_nodes: the largest proposal it makes (tree nodes); 0 = bounded by the engine's max_draft.
    schedule: the adaptive schedule (sizing/tree.py) this generation's trees are grown and trimmed
        by, made fresh by `start`; None: a fixed shape, or a chain. The engine's sizer for the request (sizing/request.py)
        shares it.
    target_layers: target hidden layers it reads (as in Transformer.forward's `hidden_layers`: 0 =
        embeddings, L = final norm); () costs nothing extra. The engine then requests those layers in
        the prefill and every verification pass, and calls `observe` with the rows ([n, H] per layer)
        of the tokens just committed to the target's cache, in sequence order: after `start`, the
        prompt's rows (all of it but its last token; not called for a one-token prompt), and after each
        verification the root's row then the accepted drafts' rows (a tree: its accepted path). So before
        each `propose(tokens, ...)` the drafter has seen exactly the rows of tokens[:-1].
    """

    name: str
    sizes_itself: bool
    max_nodes: int
    target_layers: tuple[int, ...]
    schedule: AdaptiveTreeScheduler | None

    def start(self, prompt_ids: list[int], capacity: int, params: SamplingParams, generator: torch.Generator) -> None:
        """Begin a new generation. capacity bounds the sequence length (prompt + new + drafts)."""

    def couple(self, noise: GumbelNoise | None) -> None:
        """Called after start: the noise the verifier's coupled rule decides this generation's tokens with
        (coupled.py), or None under greedy decoding or the rejection rule. A drafter that drafts with it
        (coupled.draft_ranking) proposes the target's token more often; any proposal stays lossless."""

    def propose_steps(self, tokens: list[int], max_tokens: int) -> Generator[DraftPass, Any, Proposal]:
        """propose() as a generator that yields each forward of its own model (a DraftPass) and is sent its
        output: a batch runs the passes of requests sharing a model in one packed forward (run_together); alone,
        run_alone runs each as it comes. Drafters without a model of their own yield nothing (DrafterBase)."""
        ...

    def propose(self, tokens: list[int], max_tokens: int) -> Proposal:
        """Propose up to max_tokens continuing `tokens` (every committed token so far)."""

    def observe(self, hidden: dict[int, torch.Tensor]) -> None:
        """Committed tokens' target hidden rows, per layer of target_layers (see above)."""

    def verified(self, accepted: int, verify_seconds: float, verified_nodes: int) -> None:
        """The last proposal's outcome: accepted draft tokens, the pass's time, nodes verified (more than
        proposed when the engine merged in a result-cache branch). Drafters that learn from timings use it."""

    def warm_up(self) -> None:
        """Throw-away forwards of the drafter's own model, so the first generation is not the slow one."""

    def cache_bytes(self) -> int:
        """Bytes of the drafter's own KV cache (0 without one)."""

    def modules(self) -> tuple[torch.nn.Module, ...]:
        """The weights it holds (a draft model, head or draft; some shared with the target), for memory accounting."""


@dataclass
class DraftPass:
    """A forward a drafter asks for while proposing: `model` over Transformer.forward's arguments, through `step`
    instead where given (a lean step with another output layer: a draft model's hot vocabulary). Passes that share
    a model and step can run as one packed forward (their fields are a target pass's: runtime/packed.py)."""

    model: torch.nn.Module
    input_ids: torch.Tensor
    positions: torch.Tensor
    cache: Any
    tree_mask: torch.Tensor | None = None
    hidden_layers: tuple[int, ...] = ()
    logits_rows: torch.Tensor | slice | None = None
    step: Any = None  # runtime.lean_step.LeanStep, or None: the model's own forward

    @property
    def group(self) -> tuple:
        """Passes with the same group can run as one packed forward (runtime/packed.run_draft_passes)."""
        return ("forward", id(self.model), id(self.step))

    def run(self):
        """This pass alone (a models.transformer.ForwardOutput)."""
        args = (self.input_ids, self.positions, self.cache, self.tree_mask, self.hidden_layers, self.logits_rows)
        return self.model(*args) if self.step is None else lean_forward(self.step, *args)


def run_alone(steps: Generator[DraftPass, Any, Any]):
    """Drive a propose_steps generator, running each pass it yields alone; returns what it returns."""
    try:
        request = next(steps)
        while True:
            request = steps.send(request.run())
    except StopIteration as done:
        return done.value


class DrafterBase:
    """Defaults for the optional capabilities: a chain drafter that reads no hidden states and holds no weights."""

    name = "drafter"
    sizes_itself = False
    max_nodes = 0
    target_layers: tuple[int, ...] = ()
    schedule: AdaptiveTreeScheduler | None = None
    noise: GumbelNoise | None = None

    def couple(self, noise: GumbelNoise | None) -> None:
        self.noise = noise

    def propose_steps(self, tokens: list[int], max_tokens: int) -> Generator[DraftPass, Any, Proposal]:
        return self.propose(tokens, max_tokens)
        yield  # a generator that asks for no pass: the drafter runs no model, or runs it alone

    def observe(self, hidden: dict[int, torch.Tensor]) -> None:
        raise RuntimeError(f"the {self.name} drafter reads no target hidden states (target_layers is empty)")

    def verified(self, accepted: int, verify_seconds: float, verified_nodes: int) -> None:
        pass

    def warm_up(self) -> None:
        pass

    def cache_bytes(self) -> int:
        return 0

    def modules(self) -> tuple[torch.nn.Module, ...]:
        return ()


def empty_proposal(device: torch.device | str = "cpu") -> Proposal:
    return Proposal(tokens=torch.empty(0, dtype=torch.long, device=device))
