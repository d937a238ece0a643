"""The lean step: a pass of a few tokens through a Llama-shaped fp32 model in one native call.

In eager PyTorch a one-token step of SmolLM2-135M issues ~600 operations; on a 2-core CPU their dispatch and
temporaries cost as much as its 4-bit projections (docs/speed.md). kernels/lean_decode.cpp runs the same
arithmetic (fp32 activations, the same weights) in one call, for one-token steps and verification passes alike
(up to LEAN_MAX_ROWS tokens, with a tree mask). Each row gets the arithmetic it would get alone, so a token
verified in a tree and the same token decoded alone compute the same numbers; against a PyTorch pass over the same
weights (prompts) it agrees up to summation order, as PyTorch passes of different widths already do.

Where it applies: a CPU model in float32 whose layers are Llama-shaped (RMSNorm, SiLU MLP, full rotary, no
soft-caps or sliding windows; biases allowed: Qwen2's q, k, v; Qwen3's RMSNorm per q / k head too), with projections stored as the file's
Q4_1 blocks or foretell's int4 (Int4Linear), GGUF Q8_0 blocks (BlockQ8Linear), a GGUF file's blocks of any type
the kernel reads (gguf_quant.GGUFLinear: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), foretell's int8
(Int8Linear: one scale a row, so every block of a row has it) or dense fp32 (read as bf16 where every value is a
bf16 number: a bf16 target on CPU runs so, run_bf16_as_float32). `lean_support` says why not otherwise; the step
is then simply not used.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from foretell.kernels import (  # the projection kinds, as lean_decode.cpp numbers them
    BF16, BF16A, BF16X, F32, GGUF_KIND, I8X, KQ4X, KQ6X, Q4, Q4X, Q8, Q8X, amx_products, lean_decode, lean_module,
)
from foretell.models.norms import RMSNorm
from foretell.models.transformer import ForwardOutput, Transformer
from foretell.runtime import wide_linear
from foretell.runtime.gguf_quant import BLOCK_TYPES, BlockQ8Linear, GGUFLinear, block_shape, row_bytes, signed_codes
from foretell.runtime.quant import Int4Linear, Int8Linear, q4_blocks
from foretell.runtime.wide_linear import Bf16ProductLinear

# Q4, Q8, F32: Q4_1 blocks (foretell's int4, a GGUF file's Q4_1), Q8_0 blocks (int8, a GGUF file's Q8_0), dense fp32.
# Q4X, Q8X: the same blocks with 8 output columns interleaved, for 8-bit activations (interleaved below).
# BF16, BF16X: a dense fp32 weight whose every value is a bf16 number (a model loaded from a bf16 checkpoint): the
# same values in half the bytes, 16 output columns interleaved (BF16X, bf16_interleaved below) where the count allows.
# I8X: an int8 layer with a scale per output row (quant.Int8Linear, drafters' int8), 16 output columns interleaved.
# BF16A: a bf16 model's weight (wide_linear.Bf16ProductLinear) where the CPU has AMX: bf16 products on its tiles.
# GGUF: a GGUF file's blocks as it ships them, parts of rows in their own types (gguf_quant.GGUFLinear).
GGUF = GGUF_KIND
# Passes of up to this many tokens (one-token steps, verification trees) run natively in one call; longer ones
# (prompts) in PyTorch, whose products are made for many rows.
LEAN_MAX_ROWS = 32
# ... except a verification pass: a tree of any size, or a chain (no tree mask) of up to this many tokens after a
# context, in lean calls of LEAN_MAX_ROWS, so that a drafted token computes the numbers its one-token step would
# (PyTorch's products sum in another order, or in bf16). The scheduler's trees reach sizing/cost.DEFAULT_SIZES' 64.
LEAN_CHUNKED_ROWS = 64


def projection(layer: nn.Module, bf16: bool = True) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kind, codes or dense weight, scales, bias) of one projection, as lean_decode.cpp reads them. bf16: a dense
    weight of bf16 numbers as bf16 (False: as fp32, for A/B runs)."""
    empty = torch.empty(0)
    kind = kind_of(layer)
    if kind == GGUF:  # the bytes, and their layout (int64, not scales)
        bias = torch.empty(0) if layer.bias is None else layer.bias.detach().float().contiguous()
        return kind, layer.raw, layer.layout, bias
    if isinstance(layer, BlockQ8Linear):
        main, scales = layer.codes, layer.scales
    elif kind == Q8:  # an Int8Linear
        main, scales = layer.weight_int8, layer.scales_by_block()
    elif kind == Q4:
        main, scales = q4_blocks(layer)
    else:
        main, scales = layer.weight.detach(), empty
        packed = as_bf16(layer) if bf16 else None
        if packed is not None:  # exactly bf16 numbers: half the bytes, same values
            kind, main = packed
    bias = empty if layer.bias is None else layer.bias.detach().float()
    return kind, main.contiguous(), scales.float().contiguous(), bias.contiguous()


def as_bf16(layer: nn.Module) -> tuple[int, torch.Tensor] | None:
    """A dense layer's weight packed as bf16 where every value is a bf16 number, else None: for a bf16 model's
    layer (Bf16ProductLinear) on a CPU with AMX, in its tiles (amx_tiles: bf16 products); else column-interleaved
    (bf16_interleaved: fp32 products of the same values). Kept on the layer for its current values, so that the
    packings of one weight share one copy: a target's output layer in its lean step and a drafter sharing it (a
    head or hidden-state draft without a hot vocabulary)."""
    weight = layer.weight.detach()
    amx = isinstance(layer, Bf16ProductLinear) and amx_products()
    key = (weight.data_ptr(), weight._version, tuple(weight.shape), amx)
    cached = layer.__dict__.get("_bf16_packing")
    if cached is None or cached[0] != key:
        halved = weight.bfloat16()
        packed = None
        if torch.equal(halved.float(), weight):
            packed = amx_tiles(halved) if amx else bf16_interleaved(halved)
        cached = (key, packed)
        layer.__dict__["_bf16_packing"] = cached
    return cached[1]


def bf16_interleaved(weight: torch.Tensor) -> tuple[int, torch.Tensor]:
    """A bf16 weight [N, K] in lean_decode.cpp's BF16X layout [N / 16, K, 16] where N allows (else BF16 as it is):
    per input k the 16 columns' weights side by side, in the order (0-3, 8-11, 4-7, 12-15), which the kernel's two
    unpacks of one 32-byte load turn into columns 0..7 and 8..15."""
    N, K = weight.shape
    if N % 16:
        return BF16, weight.contiguous()
    return BF16X, weight.view(N // 16, 2, 2, 4, K).permute(0, 4, 2, 1, 3).reshape(N // 16, K, 16).contiguous()


def amx_tiles(weight: torch.Tensor) -> tuple[int, torch.Tensor]:
    """A bf16 weight [N, K] in AMX's tile layout (BF16A) [N / 16, K / 2, 32]: per 16 output columns and pair of
    inputs (2i, 2i + 1), each column's two weights side by side; a tile is 16 such pairs. Where N or K does not
    allow it, bf16_interleaved's layout (the same values, fp32 products)."""
    N, K = weight.shape
    if N % 16 or K % 32:
        return bf16_interleaved(weight)
    return BF16A, weight.view(N // 16, 16, K // 2, 2).permute(0, 2, 1, 3).reshape(N // 16, K // 2, 32).contiguous()


def interleaved(kind: int, main: torch.Tensor, scales: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Q4 or Q8 blocks in lean_decode.cpp's column-interleaved layout (Q4X, Q8X), which 8-bit activations multiply
    8 output columns at a time; other kinds, and layers whose output count is not a multiple of 8, as they are.
    Per group of 8 columns and block, vector j holds 4 consecutive codes of each column: for Q8 inputs 4j..4j+3;
    for Q4 the block's bytes 4j..4j+3 (inputs 4j + i in the low nibbles, 16 + 4j + i in the high ones).
    A GGUF projection becomes the interleaved kind its block types allow (gguf_records)."""
    if kind == GGUF:
        return gguf_records(main, scales)
    if kind not in (Q4, Q8) or main.shape[0] % 8:
        return kind, main, scales
    groups, blocks = main.shape[0] // 8, scales.shape[1]
    width = 16 if kind == Q4 else 32  # bytes a block
    codes = main.view(groups, 8, blocks, width // 4, 4).permute(0, 2, 3, 1, 4).contiguous()
    if kind == Q4:  # (d, m) pairs -> the 8 columns' d, then their m
        return Q4X, codes.view(groups, blocks, 128), scales.view(groups, 8, blocks, 2).permute(0, 2, 3, 1).contiguous()
    return Q8X, codes.view(groups, blocks, 256), scales.view(groups, 8, blocks).permute(0, 2, 1).contiguous()


GGML_Q4_0, GGML_Q5_0, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K = (
    BLOCK_TYPES[name] for name in ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"))


def gguf_records(raw: torch.Tensor, layout: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    """A GGUF projection's blocks in a column-interleaved kind where its rows come in groups of 8, else as they are
    (GGUF, bytes, layout): KQ4X (every part Q4_K), KQ6X (every part Q6_K), Q4X (every part Q4_0: Q4_1's layout with
    m = -8 d), Q8X (parts in Q4_0, Q5_0 and Q8_0, all w = d * code: as Q8_0 blocks, 36 bytes a block where Q5_0
    has 22, streamed at memory speed where Q5_0's rows are compute-bound; a Qwen2.5-0.5B draft's step 28 -> ~19 ms)."""
    parts = layout.tolist()
    K, types, counts = parts[0], parts[1::2], parts[2::2]
    rows = sum(counts)
    if rows % 8:
        return GGUF, raw, layout
    if set(types) == {GGML_Q4_K}:
        return KQ4X, lean_module().interleave_q4k(raw.contiguous(), rows, K), torch.empty(0)
    if set(types) == {GGML_Q6_K}:
        return KQ6X, lean_module().interleave_q6k(raw.contiguous(), rows, K), torch.empty(0)
    if set(types) == {GGML_Q4_0}:  # the codes are Q4_1's bytes; (d, m = -8 d) per block
        blocks = raw.view(rows, K // 32, block_shape(GGML_Q4_0)[1])
        d = blocks[..., :2].contiguous().view(torch.float16).float()
        codes = blocks[..., 2:].reshape(rows, K // 2).contiguous()
        return interleaved(Q4, codes, torch.cat([d, -8 * d], dim=-1).contiguous())
    if set(types) <= {GGML_Q4_0, GGML_Q5_0, GGML_Q8_0}:
        pieces, at = [], 0
        for kind, count in zip(types, counts):
            size = count * row_bytes(kind, K)
            pieces.append(signed_codes(kind, raw[at:at + size].numpy(), count, K))
            at += size
        codes, d = (torch.cat(p) for p in zip(*pieces))
        return interleaved(Q8, codes, d)
    return GGUF, raw, layout


def lean_support(model, as_float32: bool = False) -> str | None:
    """None where the lean step can run `model` (as_float32: once converted to float32), else why not (one line)."""
    c = model.config
    if model.device.type != "cpu" or (model.dtype != torch.float32 and not as_float32):
        return "the lean step runs float32 models on CPU"
    if not model.uniform or c.sandwich_norms or c.attn_softcap or c.final_softcap:
        return "the lean step runs Llama-shaped layers (no sliding windows, sandwich norms or soft-caps)"
    if c.embedding_scale is not None or c.rotary_dim is not None or c.attention_scale is not None:
        return "the lean step runs Llama-shaped layers (unscaled embeddings, full rotary, default attention scale)"
    if c.hidden_act not in ("silu", "swish"):
        return f"the lean step runs SiLU MLPs, not {c.hidden_act}"
    if c.head_dim % 8:
        return f"the lean step runs head sizes that are multiples of 8, not {c.head_dim}"
    norms = [model.norm] + [n for layer in model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    norms += [n for layer in model.layers for n in (layer.q_norm, layer.k_norm) if n is not None]
    if any(type(n) is not RMSNorm for n in norms):
        return "the lean step runs plain RMSNorm"
    try:
        for layer in model.layers:
            for p in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
                kind_of(p)
        kind_of(model.lm_head)
    except ValueError as e:
        return str(e)
    if lean_decode() is None:
        return "the lean step's kernel is not built here"
    return None


def run_bf16_as_float32(model) -> bool:
    """A bf16 model on CPU runs as float32 activations over its own bf16 weights, where the lean step suits it:
    converted to float32 in place (exact: a bf16 is the top half of an fp32) while the lean step streams the
    weights as bf16 (BF16X), half the bytes. Where bf16 products are emulated (AVX2), a one-token step of SmolLM2
    then cost 0.37x of PyTorch's bf16 one, and a pass of 8 tokens 1.8x a one-token step; where they are native
    (AMX), 0.32x (11.2 against 35.4 ms), so there too, and the passes the lean step does not take (prompts, batched
    steps) keep bf16 products on a bf16 copy (wide_linear.Bf16ProductLinear), ~2x faster than fp32 there
    (docs/speed.md). Elsewhere PyTorch's passes use the float32 weights. Returns whether it converted."""
    if model.device.type != "cpu" or model.dtype != torch.bfloat16 or lean_support(model, as_float32=True):
        return False
    model.float()
    wide_linear.bf16_wide_products(model)  # only where bf16 products are native
    return True


def kind_of(layer: nn.Module) -> int:
    if isinstance(layer, GGUFLinear):
        return GGUF
    if isinstance(layer, BlockQ8Linear) or (isinstance(layer, Int8Linear) and layer.in_features % 32 == 0):
        return Q8
    if isinstance(layer, Int4Linear):
        if layer.group != 32:
            raise ValueError("the lean step reads int4 groups of 32")
        return Q4
    if type(layer) is nn.Linear or isinstance(layer, Bf16ProductLinear):
        return F32
    raise ValueError(f"the lean step has no kernel for {type(layer).__name__}")


def packed_layer(first_norm: nn.Module, second_norm: nn.Module, projections, interleave: bool = False,
                 bf16: bool = True, qk_norms: tuple = (None, None)) -> tuple[list[torch.Tensor], list[int]]:
    """One decoder layer as lean_decode.cpp reads it: its two norms' weights, then (codes or dense, scales, bias) of
    each projection (qkv, o, gate_up, down), then the q and k heads' norm weights (qk_norms; empty where None); and
    the projections' kinds. interleave: blocks in the layout of 8-bit activations (`interleaved`)."""
    tensors = [first_norm.weight.detach().float().contiguous(), second_norm.weight.detach().float().contiguous()]
    kinds = []
    for layer in projections:
        kind, main, scales, bias = packed_projection(layer, interleave, bf16)
        kinds.append(kind)
        tensors += [main, scales, bias]
    tensors += [torch.empty(0) if n is None else n.weight.detach().float().contiguous() for n in qk_norms]
    return tensors, kinds


def packed_projection(layer: nn.Module, interleave: bool,
                      bf16: bool = True) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not interleave and isinstance(layer, Int8Linear) and layer.columns16() is not None:
        bias = torch.empty(0) if layer.bias is None else layer.bias.detach().float().contiguous()
        return I8X, layer.columns16(), layer.scale.float().contiguous(), bias
    kind, main, scales, bias = projection(layer, bf16)
    if interleave:
        kind, main, scales = interleaved(kind, main, scales)
    return kind, main, scales, bias


def visible_slots(tree_mask: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """A tree pass's mask as lean_decode reads it, bool [rows, length + rows]: the last K slots per the tree mask
    [rows, K], the committed ones before them all visible."""
    visible = torch.ones(rows, length + rows, dtype=torch.bool)
    visible[:, visible.shape[1] - tree_mask.shape[1]:] = tree_mask
    return visible


def packed_segments(caches: list, sizes: list[int], tree_masks: list) -> tuple[list, list, list[int], list]:
    """lean_decode_packed's per-segment arguments for passes of `sizes` rows over `caches` (tree_masks: each pass's
    tree mask or None): the caches' keys, values, lengths and visible slots (empty: causal), after checking that
    each cache has room for its rows."""
    for cache, size in zip(caches, sizes):
        cache.check_room(size)
    visible = [torch.empty(0, dtype=torch.bool) if mask is None else visible_slots(mask, size, cache.length)
               for cache, size, mask in zip(caches, sizes, tree_masks)]
    return [c.k for c in caches], [c.v for c in caches], [c.length for c in caches], visible


def run_chunked(kernel, max_rows: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache,
                tree_mask: torch.Tensor | None, weights: tuple, side: torch.Tensor | None = None,
                side_norm: torch.Tensor | None = None,
                logits_from: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lean_decode over T rows after the cache's length, max_rows at a time (a row's arithmetic does not depend
    on the rows beside it), writing their cache slots. weights: (layers, head, kinds, heads, kv_heads, eps,
    act_q8). Returns logits, states [L + 1, T, H] and the last layer's outputs before the final norm. logits: of
    the rows from the first chunk holding row `logits_from` (skip_logits says which: the chunks before it run
    without the output layer, a product over the vocabulary that a prompt's rows would mostly throw away)."""
    T = x.shape[0]
    visible = None if tree_mask is None else visible_slots(tree_mask, T, cache.length)
    empty = torch.empty(0)
    layers, head, kinds, *rest = weights
    headless = (layers, head[:1], kinds[:-1], *rest)  # the final norm alone: no output layer, no logits
    skip = skip_logits(T, max_rows, logits_from) if len(head) > 1 else 0
    parts = []
    for start in range(0, T, max_rows):
        end = min(start + max_rows, T)
        # rows see only earlier slots (a tree lists parents first), so a chunk's mask ends at its last row
        seen = torch.empty(0, dtype=torch.bool) if visible is None else visible[start:end, :cache.length + end]
        parts.append(kernel(x[start:end], cos[start:end], sin[start:end], cache.k, cache.v, cache.length + start,
                            seen, *(headless if end <= skip else weights), empty if side is None else side[start:end],
                            empty if side_norm is None else side_norm))
    if len(parts) == 1:
        return tuple(parts[0])
    return (torch.cat([p[0] for p in parts if p[0].shape[1]]),
            torch.cat([p[1] for p in parts], dim=1), torch.cat([p[2] for p in parts]))


def skip_logits(rows: int, max_rows: int, logits_from: int) -> int:
    """How many leading rows of a pass of `rows` that run_chunked splits max_rows at a time get no logits: the
    whole chunks before row logits_from (the last chunk always keeps them, so logits have their vocabulary's
    width even where no row is wanted)."""
    return min(max(logits_from, 0), rows - 1) // max_rows * max_rows


class LeanStep:
    """The packed weights of one model and the call that runs a lean pass on them. Built once; int4 layers
    keep their blocks (a second copy of the codes next to PyTorch's kernel layout, which is opaque)."""

    def __init__(self, model, act_q8: bool = False, interleave: bool = True, bf16: bool = True):
        self.model = model
        self.bf16 = bf16  # dense weights of bf16 numbers streamed as bf16 (False: as fp32, A/B runs)
        c = model.config
        self.heads, self.kv_heads, self.eps = c.num_attention_heads, c.num_key_value_heads, float(c.rms_norm_eps)
        self.max_rows = LEAN_MAX_ROWS
        self.interleave = interleave  # with 8-bit activations: the column-interleaved blocks (False: A/B runs)
        self.act_q8 = act_q8  # 8-bit activations in the block projections: lossy, opt-in (Transformer.use_lean_step)
        self.kernel = lean_decode()
        self.kernel_packed = lean_module().lean_decode_packed  # several sequences' rows (runtime/packed.py)

    @property
    def act_q8(self) -> bool:
        return self._act_q8

    @act_q8.setter
    def act_q8(self, on: bool) -> None:
        """Packs the weights for that mode: 8-bit activations read the blocks column-interleaved."""
        self._act_q8 = on
        interleave = on and self.interleave
        self.tensors, self.kinds = [], []
        for layer in self.model.layers:
            tensors, kinds = packed_layer(layer.input_layernorm, layer.post_attention_layernorm,
                                          (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj),
                                          interleave, self.bf16, (layer.q_norm, layer.k_norm))
            self.tensors += tensors
            self.kinds += kinds
        kind, *parts = packed_projection(self.model.lm_head, interleave, self.bf16)
        self.kinds.append(kind)
        self.head = [self.model.norm.weight.detach().float().contiguous(), *parts]
        # some dense weights are read as bf16 (they hold bf16 numbers); read per batched pass, so kept
        self.streams_bf16 = any(kind in (BF16, BF16X, BF16A) for kind in self.kinds)
        self.amx = BF16A in self.kinds  # bf16 products on AMX tiles

    def with_head(self, layer: nn.Module) -> LeanStep:
        """The same model's step with another output layer (a draft model's hot vocabulary: its rows only), the
        decoder layers' packing shared."""
        other = copy.copy(self)
        kind, *parts = packed_projection(layer, self.act_q8 and self.interleave, self.bf16)
        other.kinds = self.kinds[:-1] + [kind]
        other.head = [self.head[0], *parts]
        return other

    @property
    def weights(self) -> tuple:
        """The kernel's arguments after the activations and caches: (layers, head, kinds, heads, kv_heads, eps,
        act_q8)."""
        return self.tensors, self.head, self.kinds, self.heads, self.kv_heads, self.eps, self.act_q8

    def takes(self, rows: int, context: int, tree: bool = False) -> bool:
        """Whether a pass of `rows` tokens after `context` committed ones runs here (else in PyTorch): every pass
        with 8-bit activations; else up to max_rows, a tree of any size, and after a context up to
        LEAN_CHUNKED_ROWS (in chunks)."""
        return rows <= self.max_rows or self.act_q8 or tree or (context > 0 and rows <= LEAN_CHUNKED_ROWS)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, cache,
                 tree_mask: torch.Tensor | None = None, logits_from: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A pass with forward's arguments; writes the cache's slots after its length. Returns logits and states
        [L + 1, T, H] (forward's hidden layers 0..L). Passes of more than max_rows tokens (prompts, with 8-bit
        activations) run in consecutive chunks; logits: the last rows', from skip_logits(T, max_rows, logits_from)
        on."""
        model = self.model
        cos, sin = model.rope(positions, int(positions.max()), torch.float32)
        logits, states, _ = run_chunked(self.kernel, self.max_rows, model.embed_tokens(input_ids), cos, sin, cache,
                                        tree_mask, self.weights, logits_from=logits_from)
        return logits, states


class LeanTransformer(Transformer):
    """The fast-path target: the PyTorch model (models/transformer.py), whose passes the lean step takes run in one
    native call once use_lean_step() took, with the model's forward and forward_packed. Every other pass (and every
    pass while `lean` is None) is the PyTorch model's own. Models are loaded as this class (runtime/loading.py), so
    `lean` is there to ask; runtime/prepare.py decides whether it is set."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lean: LeanStep | None = None  # use_lean_step(): passes of a few tokens in one native call

    def use_lean_step(self, on: bool = True, act_q8: bool = False) -> str | None:
        """Run passes of a few tokens (plain decoding's steps, verification) in one native call where it applies to
        this model; returns why not where it does not (then nothing changes). on=False goes back to PyTorch's path.
        act_q8: 8-bit activations in the block projections (lossy, opt-in); then every pass with a single-sequence
        cache runs in the lean step, prompts in chunks, so prompt and steps are one model."""
        self.lean = None
        if not on:
            return None
        reason = lean_support(self)
        if reason is None:
            self.lean = LeanStep(self, act_q8)
        return reason

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache, tree_mask: torch.Tensor | None = None,
                hidden_layers: tuple[int, ...] = (), logits_rows: torch.Tensor | slice | None = None) -> ForwardOutput:
        """Transformer.forward, through the lean step where it takes the pass (a single sequence's cache)."""
        lean = self.lean
        if lean is not None and lean.takes(input_ids.shape[0], cache.length, tree_mask is not None) \
                and cache.k.shape[1] == 1:
            return lean_forward(lean, input_ids, positions, cache, tree_mask, hidden_layers, logits_rows)
        return super().forward(input_ids, positions, cache, tree_mask, hidden_layers, logits_rows)


def lean_forward(step: LeanStep, input_ids: torch.Tensor, positions: torch.Tensor, cache,
                 tree_mask: torch.Tensor | None = None, hidden_layers: tuple[int, ...] = (),
                 logits_rows: torch.Tensor | slice | None = None) -> ForwardOutput:
    """A pass through `step` (one it takes: LeanStep.takes, a single sequence's cache) with Transformer.forward's
    arguments and output."""
    T = input_ids.shape[0]
    cache.check_room(T)
    if logits_rows is None:
        logits, states = step(input_ids, positions, cache, tree_mask)
        return ForwardOutput(logits=logits, hidden={i: states[i] for i in hidden_layers})
    wanted = torch.arange(T)[logits_rows]  # a prompt wants none or its last row's: its other chunks skip the product
    first = int(wanted.min()) if wanted.numel() else T
    logits, states = step(input_ids, positions, cache, tree_mask, logits_from=first)
    return ForwardOutput(logits=logits[wanted - (T - logits.shape[0])],  # logits hold the last rows only
                         hidden={i: states[i] for i in hidden_layers})
