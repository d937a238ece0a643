"""Drafter modules in the lean step (runtime/lean_step.py): an EAGLE-3 head's step and logits in one native call,
and a hidden-state draft's or parallel head's decoder layers in one call with their output (and input) projections
in the column kernel. Drafts only propose, so their rounding can move acceptance, never the output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from foretell.kernels import BF16A, BF16X, I8X, block_gemm, lean_decode, lean_module
from foretell.models.norms import RMSNorm
from foretell.runtime.lean_step import (LEAN_MAX_ROWS, kind_of, packed_layer, packed_projection, packed_segments,
                                        run_chunked)
from foretell.runtime.quant import FUSED_MAX_ROWS


def head_lean_support(head) -> str | None:
    """None where the lean step can run an EAGLE-3 head (models/eagle3.py), else why not."""
    m = head.midlayer
    return drafter_lean_support(head, (m.input_layernorm, m.hidden_norm, m.post_attention_layernorm, head.norm),
                                (m.qkv_proj, m.o_proj, m.gate_up_proj, m.down_proj, head.lm_head))


def layers_lean_support(module, layers, final_norm, final_softcap) -> str | None:
    """None where the lean step can run a drafter module's decoder layers (models/transformer.DecoderLayer) and
    final norm (LeanDraftLayers: a hidden-state draft, a parallel head), else why not."""
    if final_softcap is not None:
        return "the lean step runs output layers without a soft-cap"
    for layer in layers:
        if layer.q_norm is not None or layer.attn_output_norm is not None or layer.attn_softcap is not None \
                or layer.rotary_dim is not None or layer.scale is not None or layer.act is not F.silu:
            return "the lean step runs Llama-shaped layers (no q/k or sandwich norms or soft-caps, full rotary, SiLU)"
    norms = [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)] + [final_norm]
    projections = [p for layer in layers for p in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)]
    return drafter_lean_support(module, norms, projections)


def drafter_lean_support(module, norms, projections) -> str | None:
    """None where the lean step can run a drafter module with these norms and projections, else why not."""
    if module.device.type != "cpu" or module.dtype != torch.float32:
        return "the lean step runs float32 drafters on CPU"
    if module.config.head_dim % 8:
        return f"the lean step runs head sizes that are multiples of 8, not {module.config.head_dim}"
    if any(type(n) is not RMSNorm for n in norms):
        return "the lean step runs plain RMSNorm"
    try:
        for layer in projections:
            kind_of(layer)
    except ValueError as e:
        return str(e)
    if lean_decode() is None:
        return "the lean step's kernel is not built here"
    return None


def column_product(layer: nn.Module):
    """(block_gemm, kind, packed weight, scales) where `layer` packs to the column kernel (bf16 numbers or int8, no
    bias), else None: a few rows through it cost little more than one (kernels/lean/columns.h, group_x16)."""
    try:
        kind, main, scales, bias = packed_projection(layer, interleave=False)
    except ValueError:  # a layer type the kernel does not read: PyTorch's product serves it
        return None
    return (block_gemm(), kind, main, scales) if kind in (BF16X, I8X, BF16A) and not bias.numel() else None


def run_column_product(packed, rows: torch.Tensor) -> torch.Tensor | None:
    """rows [T, K] @ W^T through column_product's packing, or None where it did not pack or T is past the kernel."""
    if packed is None or rows.shape[0] > FUSED_MAX_ROWS:
        return None
    gemm, kind, main, scales = packed
    return gemm(rows.float().contiguous(), kind, main, scales)


class LeanEagle3Step:
    """An EAGLE-3 head's step and output layer in one native call: its layer reads [norm(embeddings), norm(hidden)]
    (lean_decode's side input). Only drafts come out of it, so its rounding can move acceptance, never exactness."""

    def __init__(self, head, act_q8: bool = False):
        m = head.midlayer
        c = head.config
        self.head_module = head
        self.act_q8 = act_q8
        self.tensors, kinds = packed_layer(m.hidden_norm, m.post_attention_layernorm,
                                           (m.qkv_proj, m.o_proj, m.gate_up_proj, m.down_proj), act_q8)
        kind, *parts = packed_projection(head.lm_head, act_q8)
        self.kinds = kinds + [kind]
        self.head = [head.norm.weight.detach().float().contiguous(), *parts]
        self.side_norm = m.input_layernorm.weight.detach().float().contiguous()
        self.heads, self.kv_heads, self.eps = c.num_attention_heads, c.num_key_value_heads, float(c.rms_norm_eps)
        self.kernel = lean_decode()
        self.kernel_packed = lean_module().lean_decode_packed  # several requests' steps in one call (packed)
        self.max_rows = LEAN_MAX_ROWS  # longer passes (a prompt's rows) run faster as PyTorch's matrix products
        # fc, once a pass over the rows committed since the last: in the column kernel where its weights pack to
        # one (bf16 numbers, or int8): PyTorch's float32 product of a few rows cost ~1 ms a pass here
        self.fc = column_product(head.fc)
        # the output layer alone, for passes that need one row's logits (the context fed after a verification, the
        # whole prompt after a prefill): every row's would cost a product over 8192 columns each; with 8-bit
        # activations the kernel's own product keeps them
        self.output = None if act_q8 else column_product(head.lm_head)

    def fuse(self, features: torch.Tensor) -> torch.Tensor | None:
        """fc of target features [T, F] through the column kernel, or None where fc did not pack to it."""
        return run_column_product(self.fc, features)

    def __call__(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache,
                 tree_mask: torch.Tensor | None, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Eagle3Head.step's rows: returns (outputs [T, H] before the final norm, draft logits [T, V], or the last
        row's [1, V] with last_only)."""
        cos, sin = self.head_module.rotary(positions, int(positions.max()), torch.float32)
        headless = last_only and self.output is not None and hidden.shape[0] > 1
        head, kinds = (self.head[:1], self.kinds[:-1]) if headless else (self.head, self.kinds)
        weights = (self.tensors, head, kinds, self.heads, self.kv_heads, self.eps, self.act_q8)
        logits, states, last = run_chunked(self.kernel, LEAN_MAX_ROWS, hidden.float().contiguous(), cos, sin, cache,
                                           tree_mask, weights, side=embeds.float().contiguous(),
                                           side_norm=self.side_norm,
                                           logits_from=hidden.shape[0] - 1 if last_only and not headless else 0)
        if headless:
            return last, run_column_product(self.output, states[-1][-1:])
        return last, logits[-1:] if last_only else logits

    def packed(self, passes: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Several requests' steps of this head (drafters.base.HeadStepPass, each taken by the lean step: at most
        max_rows rows, a single float32 cache) in one lean_decode_packed call, the head's weights read once for all
        their rows. Each pass gets what it gets alone (__call__): its rows' arithmetic does not depend on the rows
        beside them, and a pass that wants only its last row's logits gets them the same way (the column kernel's
        product where __call__ uses it)."""
        sizes = [p.tokens.shape[0] for p in passes]
        starts = [sum(sizes[:i]) for i in range(len(passes))]
        k, v, lengths, visible = packed_segments([p.cache for p in passes], sizes, [p.tree_mask for p in passes])
        # per pass, the rows whose logits the kernel's output layer makes: none where the column kernel makes the
        # last row's after (__call__'s headless case), the last row where only it is wanted, else all
        headless = [p.last_only and self.output is not None and size > 1 for p, size in zip(passes, sizes)]
        picked = [[] if off else [start + size - 1] if p.last_only else list(range(start, start + size))
                  for p, off, start, size in zip(passes, headless, starts, sizes)]
        with_head = any(picked)
        head, kinds = (self.head, self.kinds) if with_head else (self.head[:1], self.kinds[:-1])
        positions = torch.cat([p.positions for p in passes])
        cos, sin = self.head_module.rotary(positions, int(positions.max()), torch.float32)
        embeds = torch.cat([self.head_module.embed(p.tokens) for p in passes]).float().contiguous()
        hidden = torch.cat([p.hidden for p in passes]).float().contiguous()
        logits, states, last = self.kernel_packed(
            hidden, cos, sin, k, v, lengths, sizes, visible, self.tensors, head, kinds, self.heads, self.kv_heads,
            self.eps, self.act_q8, [row for rows in picked for row in rows], embeds, self.side_norm)
        results, first = [], 0
        for off, rows, start, size in zip(headless, picked, starts, sizes):
            end = start + size
            if off:
                out_logits = run_column_product(self.output, states[-1][end - 1:end])
            else:
                out_logits = logits[first:first + len(rows)]
                first += len(rows)
            results.append((last[start:end], out_logits))
        return results


class LeanDraftLayers:
    """A drafter's decoder layers and final norm (a hidden-state draft's one layer, a parallel head's) in one native
    call, and its output layer in the column kernel, run separately: the drafter needs logits for some rows only (a
    hidden-state chain feeds its predictions back and scores them all at the end; a parallel head scores its last
    context row and its placeholders), and its output layer is larger than its layers. Only drafts come out of it,
    so its rounding can move acceptance, never exactness."""

    def __init__(self, layers, final_norm, output_layer, config, rotary, input_layer: nn.Module | None = None,
                 act_q8: bool = False):
        """input_layer: a projection the drafter's input rows come from (a parallel head's fuse), run in the column
        kernel too where it packs to it (`input`). act_q8: 8-bit activations in the layers' int8 projections (as the
        target's with them; drafts only propose, so this moves acceptance, never the output)."""
        self.tensors, self.kinds = [], []
        self.act_q8 = act_q8
        for layer in layers:
            tensors, kinds = packed_layer(layer.input_layernorm, layer.post_attention_layernorm,
                                          (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj), act_q8)
            self.tensors += tensors
            self.kinds += kinds
        self.head = [final_norm.weight.detach().float().contiguous()]  # the final norm alone: no logits
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.eps = float(config.rms_norm_eps)
        self.rotary = rotary
        self.output = column_product(output_layer)
        self.input_layer = None if input_layer is None else column_product(input_layer)
        self.max_rows = LEAN_MAX_ROWS  # longer passes (a prompt's rows) run faster as PyTorch's matrix products
        self.kernel = lean_decode()
        self.kernel_packed = lean_module().lean_decode_packed  # several requests' passes in one call (packed)

    def layers_pass(self, x: torch.Tensor, positions: torch.Tensor, cache) -> LayersPass:
        """The pass over rows x at `positions` (run alone, or packed with other requests' passes)."""
        return LayersPass(self, x, positions, cache)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """Rows x [T, H] after the cache's length (causal among themselves; writes their slots): the final-normed
        outputs [T, H]."""
        cos, sin = self.rotary(positions, int(positions.max()), torch.float32)
        weights = (self.tensors, self.head, self.kinds, self.heads, self.kv_heads, self.eps, self.act_q8)
        _, states, _ = run_chunked(self.kernel, LEAN_MAX_ROWS, x.float().contiguous(), cos, sin, cache, None, weights)
        return states[-1]

    def packed(self, passes: list[LayersPass]) -> list[torch.Tensor]:
        """Several requests' passes through these layers (each at most max_rows rows after a single float32 cache's
        length) in one lean_decode_packed call, the weights read once for all their rows: each pass's final-normed
        outputs, the numbers it gets alone (__call__: a row's arithmetic does not depend on the rows beside it)."""
        sizes = [p.x.shape[0] for p in passes]
        k, v, lengths, visible = packed_segments([p.cache for p in passes], sizes, [None] * len(passes))
        positions = torch.cat([p.positions for p in passes])
        cos, sin = self.rotary(positions, int(positions.max()), torch.float32)
        x = torch.cat([p.x for p in passes]).float().contiguous()
        none = torch.empty(0)
        _, states, _ = self.kernel_packed(x, cos, sin, k, v, lengths, sizes, visible, self.tensors, self.head,
                                          self.kinds, self.heads, self.kv_heads, self.eps, self.act_q8, [], none,
                                          none)
        return list(states[-1].split(sizes))

    def logits(self, states: torch.Tensor) -> torch.Tensor | None:
        """The output layer over normed rows [T, H] in the column kernel, or None where it did not pack."""
        return run_column_product(self.output, states)

    def input(self, rows: torch.Tensor) -> torch.Tensor | None:
        """The input layer over rows [T, K] in the column kernel, or None where it did not pack (or there is none)."""
        return run_column_product(self.input_layer, rows)


@dataclass
class LayersPass:
    """A pass a drafter asks for while proposing: rows x [T, H] at `positions` through a drafter module's decoder
    layers in the lean step (LeanDraftLayers.__call__, after the cache's length; at most its max_rows rows).
    Passes through one module's layers from several requests run as one packed native call
    (LeanDraftLayers.packed, runtime/packed.run_draft_passes)."""

    lean: LeanDraftLayers
    x: torch.Tensor
    positions: torch.Tensor
    cache: Any

    @property
    def group(self) -> tuple:
        return ("layers", id(self.lean))

    def run(self) -> torch.Tensor:
        """This pass alone: the final-normed outputs [T, H]."""
        return self.lean(self.x, self.positions, self.cache)


@dataclass
class HeadStepPass:
    """A step an EAGLE-3 head asks for while proposing: Eagle3Head.step_and_logits over these arguments. Steps of
    one head from several requests can run as one packed native call (runtime/lean_drafters.LeanEagle3Step.packed)."""

    head: Any  # models.eagle3.Eagle3Head
    tokens: torch.Tensor
    hidden: torch.Tensor
    positions: torch.Tensor
    cache: Any
    tree_mask: torch.Tensor | None = None
    last_only: bool = False

    @property
    def group(self) -> tuple:
        return ("eagle3 step", id(self.head))

    def run(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This step alone: (outputs [T, H], draft logits)."""
        return self.head.step_and_logits(self.tokens, self.hidden, self.positions, self.cache, self.tree_mask,
                                         self.last_only)
