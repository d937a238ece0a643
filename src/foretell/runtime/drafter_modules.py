"""Drafter modules (models/: an EAGLE-3 head, a parallel head, a hidden-state draft) made to run on this machine.

The modules describe a drafter; how it runs here is the runtime's, as a target's is (lean_step.LeanTransformer):
  - quantize_drafter: its projections stored as int8 or int4 (runtime/quant.py; "auto" = int8 on CPU). Lossless
    for decoding (drafts only propose); inference only (int8 weights do not train);
  - use_lean_step: its passes in the lean step's native calls where it suits them (float32 on CPU). It packs the
    weights as they are then: call it after quantize_drafter (and a hidden-state draft's set_draft_vocab).
"""

from __future__ import annotations

from torch import nn

from foretell.models.eagle3 import Eagle3Head
from foretell.models.hidden_draft import HiddenDraft
from foretell.models.parallel_head import ParallelHead
from foretell.runtime.lean_drafters import LeanDraftLayers, LeanEagle3Step, head_lean_support, layers_lean_support
from foretell.runtime.quant import draft_linear, quantize_linears, resolve_quant


def quantize_drafter(module: nn.Module, mode: str) -> nn.Module:
    """The module with its projections quantized per `mode`, in place (quantizing twice changes nothing).

    - EAGLE-3 head: the decoder layer and the draft output layer. It steps once per tree level, so its step time
      counts several times a pass; fc, run once a pass, stays as it is (it also places the module: `placed_by`).
    - Parallel head: the fuse and the decoder layers. A float32 head otherwise streams 4-byte weights every pass: on
      Qwen2.5-Coder-1.5B (one 1536-wide layer with an 8960-wide MLP, ~225 MB) that was most of a 25 ms draft pass.
      The output layer stays the target's rows.
    - Hidden-state draft: its decoder layer. The output layer stays as it is: its hot rows are the target's (bf16
      numbers, which the lean step's column kernel streams as such), and without a hot vocabulary it is the
      target's own."""
    make = draft_linear(resolve_quant(mode, module.device, module.dtype))
    if make is None:
        return module
    if isinstance(module, Eagle3Head):
        if isinstance(module.lm_head, nn.Linear):
            quantize_linears(module.midlayer, make)
            module.lm_head = make(module.lm_head.weight, None)
    elif isinstance(module, ParallelHead):
        if isinstance(module.fuse, nn.Linear):
            quantize_linears(module.layers, make)
            module.fuse = make(module.fuse.weight, None)
    elif isinstance(module, HiddenDraft):
        quantize_linears(module.layer, make)
    else:
        raise TypeError(f"not a drafter module: {type(module).__name__}")
    return module


def use_lean_step(module: nn.Module, on: bool = True, act_q8: bool = False) -> str | None:
    """Run the module's passes natively where it suits the lean step; returns why not otherwise (on=False: back to
    PyTorch). act_q8: 8-bit activations in its int8 projections (heads; drafts only propose, so this moves
    acceptance, never the output). A parallel head's bench-sized forward (3 context rows, 3 placeholders, 8192
    output rows) took 7.7 ms in PyTorch on 2 AVX2 cores and 0.8 ms so (benchmarks/bench/parallel_head_step.py)."""
    module.lean = None
    if isinstance(module, Eagle3Head):
        reason = head_lean_support(module) if on else None
        if on and reason is None:
            module.lean = LeanEagle3Step(module, act_q8)
        return reason
    if isinstance(module, ParallelHead):
        layers = list(module.layers)
        reason = layers_lean_support(module, layers, module.norm, module.shared.final_softcap) if on else None
        if on and reason is None:
            module.lean = LeanDraftLayers(module.layers, module.norm, module.shared.lm_head, module.config,
                                          module.rotary, input_layer=module.fuse, act_q8=act_q8)
        return reason
    if isinstance(module, HiddenDraft):
        reason = layers_lean_support(module, [module.layer], module.norm, module.shared.final_softcap) if on else None
        if on and reason is None:
            module.lean = LeanDraftLayers([module.layer], module.norm, module.shared.lm_head, module.config,
                                          module.rotary)
        return reason
    raise TypeError(f"not a drafter module: {type(module).__name__}")
