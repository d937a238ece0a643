"""One target pass for every active request (continuous batching).

Where the target runs the lean step (runtime/lean_step.py), every request's pass that the lean step takes (one-token
steps, verification chains and trees, and with 8-bit activations prompt chunks too) goes into one native call
(lean_decode_packed): each weight matrix is read once for all their rows, attention runs per request over its own
cache, and each row gets the arithmetic it would get alone, so a request's tokens in a batch are its tokens alone.
Passes the lean step does not take (long prompt chunks of a float-activation model) run in PyTorch beside it. A
target without the lean step packs all passes into one PyTorch forward (Transformer.forward_packed).
"""

from __future__ import annotations

import torch

from foretell.models.transformer import ForwardOutput, Transformer
from foretell.runtime.lean_drafters import HeadStepPass, LayersPass
from foretell.runtime.lean_step import packed_segments


def forward_packed(target: Transformer, passes: list) -> list[ForwardOutput]:
    """Each pass (decoding.TargetPass fields: input_ids, positions, cache, tree_mask, hidden_layers, logits_rows)
    through `target`, in as few passes over the weights as this runtime allows; outputs in the passes' order."""
    step = getattr(target, "lean", None)  # a LeanTransformer's lean step, where it has one
    if step is None:
        return target.forward_packed(passes)
    if len(passes) == 1:  # a lone request: the single-sequence call (the same arithmetic, less set-up a pass)
        p = passes[0]
        return [target(p.input_ids, p.positions, p.cache, p.tree_mask, p.hidden_layers, p.logits_rows)]
    native = [i for i, p in enumerate(passes) if lean_takes(step, p)]
    outputs: list[ForwardOutput | None] = [None] * len(passes)
    if native:
        for i, out in zip(native, lean_packed(target, [passes[i] for i in native])):
            outputs[i] = out
    for i, p in enumerate(passes):
        if outputs[i] is None:  # a long prompt chunk: PyTorch's products are made for many rows
            outputs[i] = target(p.input_ids, p.positions, p.cache, p.tree_mask, p.hidden_layers, p.logits_rows)
    return outputs


def lean_takes(step, p) -> bool:
    return step.takes(p.input_ids.shape[0], p.cache.length, p.tree_mask is not None) and native_cache(p.cache)


def native_cache(cache) -> bool:
    """One sequence's float32 or float16 cache: what the packed native call writes."""
    return cache.k.shape[1] == 1 and cache.k.dtype in (torch.float32, torch.float16)


def lean_packed(target: Transformer, passes: list, step=None) -> list[ForwardOutput]:
    """The passes' rows in one lean_decode_packed call (the caches get their new slots written); step: the lean
    step to run (another output layer: LeanStep.with_head), else the target's."""
    step = step or target.lean
    sizes = [p.input_ids.shape[0] for p in passes]
    k, v, lengths, visible = packed_segments([p.cache for p in passes], sizes, [p.tree_mask for p in passes])
    starts = [sum(sizes[:i]) for i in range(len(passes))]
    positions = torch.cat([p.positions for p in passes])
    cos, sin = target.rope(positions, int(positions.max()), torch.float32)
    x = target.embed_tokens(torch.cat([p.input_ids for p in passes]))
    picked = [torch.arange(start, start + size)[slice(None) if p.logits_rows is None else p.logits_rows]
              for p, start, size in zip(passes, starts, sizes)]
    logits, states, _ = step.kernel_packed(x, cos, sin, k, v, lengths, sizes, visible, *step.weights,
                                           torch.cat(picked).tolist(), torch.empty(0), torch.empty(0))
    outputs, first = [], 0
    for p, start, size, rows in zip(passes, starts, sizes, picked):
        n = rows.numel()
        hidden = {layer: states[layer, start:start + size] for layer in p.hidden_layers}
        outputs.append(ForwardOutput(logits=logits[first:first + n], hidden=hidden))
        first += n
    return outputs


def run_draft_passes(passes: list) -> list:
    """Drafters' forwards of one group (drafters.base.DraftPass of one model and step; lean_drafters.HeadStepPass of one head,
    lean_drafters.LayersPass of one module's layers) from several requests: in one native call where the lean step
    takes them all (the requests' rows read every weight once between them; each row the arithmetic it gets
    alone), else a model's in one PyTorch forward (Transformer.forward_packed: the same up to float rounding, so a
    draft may differ, never the output), else each alone."""
    first = passes[0]
    if len(passes) == 1:
        return [first.run()]
    if isinstance(first, HeadStepPass):
        lean = first.head.lean
        takes = [first.head.native(p.tokens.shape[0]) and native_cache(p.cache) for p in passes]
        if lean is None or not all(takes):
            return [p.run() for p in passes]
        return lean.packed(passes)
    if isinstance(first, LayersPass):
        if not all(native_cache(p.cache) for p in passes):
            return [p.run() for p in passes]
        return first.lean.packed(passes)
    step = first.step or getattr(first.model, "lean", None)
    if step is not None and all(lean_takes(step, p) for p in passes):
        return lean_packed(first.model, passes, step)
    if first.step is None and step is None and isinstance(first.model, Transformer):
        return first.model.forward_packed(passes)  # PyTorch's products over all rows (a GPU's draft model)
    return [p.run() for p in passes]
