"""Weight-only int8 and int4 linear layers, for drafts and (opt-in) targets.

A batch-size-1 decode step is memory-bound: it streams every weight once per token. Storing weights
as int8 (one scale per output row) halves the bytes of bf16, int4 (groups of 32 along the input,
a scale and an offset each) quarters them, and PyTorch's fused CPU kernels (`_weight_int8pack_mm`,
`_weight_int4pack_mm_for_cpu`) turn that into faster projections (measured on this machine's 2 cores:
0.79 -> 0.27 ms for a 896x9728 projection at one token as int8; 5.0 -> 0.8 ms for SmolLM2's output
layer as int4).

Quantizing a *draft* is lossless for foretell's output: the target still verifies every token. A
quantized *target* is a different model from the bf16 one: speculation stays lossless relative to it
(its own plain decoding), and what it costs against bf16 is measured (benchmarks/bench/quant_quality.py).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from foretell.errors import ForetellError
from foretell.kernels import I8X, Q4, Q8, block_gemm, lean_module
from foretell.runtime import wide_linear

QUANT_MODES = ("none", "int8", "int4", "auto")  # drafts (int4: groups of 32, CPU only; opt-in)
TARGET_QUANT_MODES = ("none", "int8", "int4", "gguf")  # targets: opt-in, a different model (gguf: the file's own)
# "-q8" after a target mode also quantizes the activations entering the block projections to 8 bits, as llama.cpp
# does (float32 CPU targets through the lean step only: runtime/lean_step.py): lossy, measured in docs/speed.md.
ACTIVATION_Q8 = "-q8"
TARGET_QUANT_CHOICES = TARGET_QUANT_MODES + tuple(m + ACTIVATION_Q8 for m in ("int8", "int4", "gguf"))
INT4_GROUP = 32
# The fused kernel is built for a few rows (decode steps); for a prefill of hundreds of tokens it
# is 2-3x slower than dequantizing the weight and running a dense matmul (measured here).
FUSED_MAX_ROWS = 32


def split_target_quant(quant: str) -> tuple[str, bool]:
    """"gguf-q8" -> ("gguf", True): the weights' mode, and whether activations go to 8 bits."""
    return quant.removesuffix(ACTIVATION_Q8), quant.endswith(ACTIVATION_Q8) and quant in TARGET_QUANT_CHOICES


def describe_target(quant: str, dtype: str, model=None) -> str:
    """What a target runs as, for the line generate and serve print: "gguf weights, 8-bit activations". model: the
    loaded target, for a bf16 one that runs as float32 activations over its bf16 weights (lean_step), and its KV
    cache's dtype where one was asked for."""
    kv = getattr(model, "kv_dtype", None)
    described = describe_weights(quant, dtype, model)
    return described + (f", {str(kv).removeprefix('torch.')} KV cache" if kv is not None else "")


def describe_weights(quant: str, dtype: str, model=None) -> str:
    weights, act_q8 = split_target_quant(quant)
    lean = getattr(model, "lean", None)
    if weights == "none":
        bf16_as_fp32 = str(dtype).removeprefix("torch.") == "bfloat16" and lean is not None and lean.streams_bf16
        if bf16_as_fp32 and lean.amx:
            return "bf16 weights, bf16 products on AMX"
        return "bf16 weights, float32 activations" if bf16_as_fp32 else dtype
    return f"{weights} weights, {'8-bit' if act_q8 else dtype} activations"


def dense_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of a dense many-row product for activations x: fp32 for bf16 on a CPU whose bf16 matmul is
    emulated (runtime/wide_linear.py), else x's own."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        if wide_linear.fp32_wide_rows(torch.get_num_threads()) is not None:
            return torch.float32
    return x.dtype


def fp32_block_gemm(flat: torch.Tensor):
    """foretell's block kernel (kernels/lean_decode.cpp) for fp32 activations of a few rows on CPU, else None."""
    if flat.dtype != torch.float32 or flat.device.type != "cpu" or flat.shape[0] > FUSED_MAX_ROWS:
        return None
    return block_gemm()


class Int8Linear(nn.Module):
    """y = x @ (int8 weight * per-row scale).T + bias, computed in the activations' dtype."""

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight_int8", weight_int8)  # [out, in] int8
        self.register_buffer("scale", scale)  # [out], the model dtype
        self.register_buffer("bias", bias)
        self.block_scales: torch.Tensor | None = None  # the scale per 32-input block, for fp32_block_gemm
        self.codes_by_16: torch.Tensor | None = None  # the codes 16 output columns interleaved (columns16)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scale.to(weight.dtype), None if bias is None else bias.detach().clone())

    @property
    def out_features(self) -> int:
        return self.weight_int8.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight_int8.shape[1]

    def scales_by_block(self) -> torch.Tensor:
        """float32 [out, in / 32]: the row's scale for each 32-input block (the block kernel's Q8 layout)."""
        if self.block_scales is None:
            self.block_scales = self.scale.float()[:, None].expand(-1, self.in_features // 32).contiguous()
        return self.block_scales

    def columns16(self) -> torch.Tensor | None:
        """int8 [out / 16, in, 16]: per input, 16 output columns' codes side by side (lean_decode.cpp's I8X, which
        multiplies any number of inputs and streams each code once for all rows of a pass); None where the output
        count is not a multiple of 16. Made once, beside the row-major codes that other paths read."""
        if self.out_features % 16:
            return None
        if self.codes_by_16 is None:
            out, n_in = self.weight_int8.shape
            self.codes_by_16 = self.weight_int8.view(out // 16, 16, n_in).transpose(1, 2).contiguous()
        return self.codes_by_16

    def select_rows(self, rows: torch.Tensor) -> Int8Linear:
        """The layer restricted to some output rows (a hot vocabulary of an output layer)."""
        rows = rows.to(self.weight_int8.device)
        bias = None if self.bias is None else self.bias.index_select(0, rows)
        return Int8Linear(
            self.weight_int8.index_select(0, rows).contiguous(), self.scale.index_select(0, rows), bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        gemm = fp32_block_gemm(flat)
        if gemm is not None and self.columns16() is not None:  # PyTorch's int8 kernel has no fast fp32 path
            y = gemm(flat.contiguous(), I8X, self.columns16(), self.scale.float())
        elif gemm is not None and self.in_features % 32 == 0:  # the same codes as blocks of 32 (Q8)
            y = gemm(flat.contiguous(), Q8, self.weight_int8, self.scales_by_block())
        elif flat.device.type == "cpu" and flat.shape[0] <= FUSED_MAX_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), self.weight_int8, self.scale.to(x.dtype))
        else:  # many rows (a prefill) or no fused kernel: dequantize on the fly, then a dense matmul
            dtype = dense_dtype(x)
            y = (F.linear(flat.to(dtype), self.weight_int8.to(dtype)) * self.scale.to(dtype)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    """y = x @ W.T + bias with W stored as 4-bit codes q in groups of INT4_GROUP input columns:
    W = (q - 8) * scale + offset per (row, group). On CPU the fused kernel reads the packed codes; elsewhere
    the weight is dequantized for each call (correct, not fast)."""

    def __init__(self, packed: torch.Tensor, scales_offsets: torch.Tensor, out_features: int, in_features: int,
                 bias: torch.Tensor | None, group: int = INT4_GROUP):
        super().__init__()
        self.register_buffer("packed", packed)  # the kernel's layout of the [out, in] codes
        self.register_buffer("scales_offsets", scales_offsets)  # [in / group, out, 2] float32
        self.register_buffer("bias", bias)
        self.out_features, self.in_features, self.group = out_features, in_features, group
        # The same weights as Q4_1 blocks for fp32 activations on CPU (q4_product, the lean step), made on first use
        self.blocks: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_codes(cls, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bias: torch.Tensor | None,
                   group: int = INT4_GROUP) -> Int4Linear:
        """q: [out, in] codes 0..15; scale, offset: [out, in / group] (W = (q - 8) * scale + offset)."""
        out_features, in_features = q.shape
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).cpu().contiguous(), 1)
        scales_offsets = torch.stack([scale.float().T, offset.float().T], dim=-1).contiguous()
        layer = cls(packed.to(q.device), scales_offsets.to(q.device), out_features, in_features,
                    None if bias is None else bias.detach().clone(), group)
        if group == 32 and q.device.type == "cpu":  # the blocks from the codes at hand (int4_blocks has to recover
            layer.blocks = q4_1_blocks(q, scale.float(), (offset - 8 * scale).float())  # them: K^2 N products)
        return layer

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, dm: torch.Tensor, bias: torch.Tensor | None) -> Int4Linear:
        """The layer whose Q4_1 blocks (q4_1_blocks' layout: codes uint8 [out, in / 2], (d, m) float32
        [out, in / 32, 2]) are these, with groups of 32."""
        out_features, blocks = dm.shape[:2]
        q = q4_codes(codes, blocks)
        d, m = dm[..., 0], dm[..., 1]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        layer = cls(packed, torch.stack([d.T, (m + 8 * d).T], dim=-1).contiguous(), out_features, blocks * 32,
                    bias, 32)
        layer.blocks = (codes.contiguous(), dm.contiguous())
        return layer

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, group: int = INT4_GROUP) -> Int4Linear:
        """Asymmetric min / max quantization per group (the layout of GGUF's Q4_1)."""
        w = weight.detach().float()
        out_features, in_features = w.shape
        if in_features % group or out_features % 16:
            raise ValueError(f"int4 needs in_features divisible by {group} and out_features by 16, got {tuple(w.shape)}")
        groups = w.view(out_features, in_features // group, group)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-12)
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).view(out_features, in_features)
        return cls.from_codes(q, scale, low + 8 * scale, bias, group)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [out, in] the codes stand for."""
        eye = torch.eye(self.in_features, dtype=torch.float32, device=self.packed.device)
        return self._mm(eye, torch.float32).T.contiguous()

    def _mm(self, flat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if flat.device.type == "cpu":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat.contiguous(), self.packed, self.group, self.scales_offsets.to(dtype))
        raise NotImplementedError("int4 weights run on CPU only")

    def select_rows(self, rows: torch.Tensor) -> nn.Module:
        """The layer restricted to some output rows (a hot vocabulary). The packed layout interleaves rows, so the
        codes are recovered exactly from the dequantized rows and packed again (dense if too few rows to pack)."""
        rows = rows.to(self.packed.device)
        w = self.dequantized().index_select(0, rows)
        so = self.scales_offsets.index_select(1, rows)  # [groups, rows, 2]
        scale, offset = so[..., 0].T, so[..., 1].T
        expand = lambda t: t.repeat_interleave(self.group, dim=1)  # noqa: E731
        q = torch.round((w - expand(offset)) / expand(scale) + 8).clamp(0, 15)
        bias = None if self.bias is None else self.bias.index_select(0, rows)
        if rows.numel() % 16:
            dense = nn.Linear(self.in_features, rows.numel(), bias=bias is not None)
            with torch.no_grad():
                dense.weight.copy_((q - 8) * expand(scale) + expand(offset))
                if bias is not None:
                    dense.bias.copy_(bias)
            return dense.requires_grad_(False)
        return Int4Linear.from_codes(q, scale, offset, bias, self.group)

    def pytorch_product(self, flat: torch.Tensor) -> torch.Tensor:
        return self._mm(flat, flat.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if flat.dtype == torch.float32 and flat.device.type == "cpu":
            y = q4_product(self, flat)
        else:
            y = self._mm(flat, x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)


def q4_blocks(layer: Int4Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's Q4_1 blocks (int4_blocks), made once and kept on the layer (a GGUF target's are the file's)."""
    if layer.blocks is None:
        layer.blocks = int4_blocks(layer)
    return layer.blocks


def q4_product(layer: Int4Linear, flat: torch.Tensor) -> torch.Tensor:
    """flat fp32 [M, K] @ W^T for an int4 layer on CPU. PyTorch's int4 kernel is slow with fp32 activations
    (8.5 ms for SmolLM2's MLP at one row here, against ~0.1 ms in bf16), so up to FUSED_MAX_ROWS rows run foretell's
    block kernel, with a one-token step's arithmetic; more rows (a prefill) a dense product on the dequantized
    blocks."""
    gemm = fp32_block_gemm(flat)
    if gemm is not None:
        return gemm(flat, Q4, *q4_blocks(layer))
    if flat.shape[0] <= FUSED_MAX_ROWS:  # no block kernel here
        return layer.pytorch_product(flat)
    return F.linear(flat, dequantize_q4(*q4_blocks(layer)))


def dequantize_q4(codes: torch.Tensor, dm: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks -> the float32 weight [out, in]: natively where the lean kernels are built (a prompt's product
    unpacks every projection once; ~5x faster than these tensor operations), else dequantize_q4_torch."""
    module = lean_module() if codes.device.type == "cpu" else None
    return dequantize_q4_torch(codes, dm) if module is None else module.dequantize_q4(codes, dm)


def dequantize_q4_torch(codes: torch.Tensor, dm: torch.Tensor) -> torch.Tensor:
    out, blocks = dm.shape[:2]
    q = q4_codes(codes, blocks).view(out, blocks, 32).float()
    return (q * dm[..., :1] + dm[..., 1:]).view(out, blocks * 32)


def q4_codes(codes: torch.Tensor, blocks: int) -> torch.Tensor:
    """Q4_1 blocks' packed codes uint8 [out, in / 2] -> the codes 0..15 uint8 [out, in] in input order (byte j of a
    block holds input j in its low nibble, input j + 16 in its high one)."""
    per_block = codes.view(codes.shape[0], blocks, 16)
    return torch.cat([per_block & 15, per_block >> 4], dim=-1).view(codes.shape[0], blocks * 32)


def int4_blocks(layer: Int4Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """An Int4Linear as Q4_1 blocks: codes uint8 [out, in / 2] (byte j of a block: input j low, j + 16 high) and
    (d, m) float32 [out, in / 32, 2], w = d * code + m: the layer's own values (codes recovered exactly). Slow for a
    large layer (its dequantized weight is an identity matrix through PyTorch's int4 product: in^2 * out products);
    Int4Linear.from_codes makes its blocks directly, so this serves layers loaded from a saved state only."""
    if layer.group != 32:
        raise ValueError("the lean step reads int4 groups of 32")
    w = layer.dequantized()  # [out, in] float32
    so = layer.scales_offsets  # [groups, out, 2]: scale, offset with W = (q - 8) * scale + offset
    scale, offset = so[..., 0].T.contiguous(), so[..., 1].T.contiguous()
    expand = lambda t: t.repeat_interleave(32, dim=1)  # noqa: E731
    codes = torch.round((w - expand(offset)) / expand(scale) + 8).clamp(0, 15)
    return q4_1_blocks(codes, scale, offset - 8 * scale)


def q4_1_blocks(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [rows, cols] 0..15 and d, m [rows, cols / 32] in the block layout lean_decode.cpp reads (Q4_1)."""
    blocks = q.to(torch.uint8).view(q.shape[0], -1, 2, 16)
    packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(q.shape[0], -1).contiguous()
    return packed, torch.stack([d.float(), m.float()], dim=-1).contiguous()


def draft_linear(mode: str):
    """make(weight, bias) for projections in a resolved mode ("int8" or "int4"; int4 where the shape takes it, else
    int8), or None for "none": a drafter's, or a target's (quantize_target)."""
    return {"int8": Int8Linear.from_weight, "int4": int4_or_int8}.get(mode)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by an Int8Linear; embeddings stay as they are.

    A tied output layer is untied first: the embedding lookup keeps its full-precision table.
    """
    return quantize_linears(model, Int8Linear.from_weight)


PROGRESS_PARAMS = 50_000_000  # a model with more weights than this in its linears shows a progress bar quantizing


def quantize_linears(model: nn.Module, make, what: str = "quantizing") -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by make(weight, bias); embeddings stay as they are. A large
    model's layers go by under a progress bar (a real-size target takes a while, and must not look hung)."""
    todo = [(parent, name, child) for parent in list(model.modules()) for name, child in list(parent.named_children())
            if isinstance(child, nn.Linear)]
    weights = sum(child.weight.numel() for _, _, child in todo)
    with tqdm(total=weights, desc=what, unit="weight", unit_scale=True, file=sys.stderr,
              disable=weights < PROGRESS_PARAMS) as bar:
        for parent, name, child in todo:
            setattr(parent, name, make(child.weight, child.bias))
            bar.update(child.weight.numel())
    return model


def quantize_target(model: nn.Module, mode: str) -> nn.Module:
    """A target's weight-only quantization (opt-in: it makes a different model): none | int8 | int4."""
    if mode not in TARGET_QUANT_MODES:
        raise ForetellError(f"unknown target quantization {mode!r}; use one of {', '.join(TARGET_QUANT_MODES)}")
    device = next(model.parameters()).device
    if mode == "int4" and device.type != "cpu":
        raise ForetellError("int4 targets run on CPU only (PyTorch's int4 CPU kernel); use int8 or none here")
    if mode == "none":
        return model
    if mode == "gguf":
        raise ForetellError("gguf quantization comes from the model's GGUF file: load the target with quant='gguf'")
    return quantize_linears(model, draft_linear(mode), f"quantizing to {mode}")


def int4_or_int8(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """Int4 where the kernel takes the shape (inputs in whole groups, outputs in 16s), else int8."""
    fits = weight.shape[1] % INT4_GROUP == 0 and weight.shape[0] % 16 == 0
    return Int4Linear.from_weight(weight, bias) if fits else Int8Linear.from_weight(weight, bias)


def resolve_quant(mode: str, device: str | torch.device, dtype: torch.dtype | None = None) -> str:
    """"auto" -> int8 on CPU (where a fused kernel exists), none elsewhere. For float32 drafts int8 runs in
    foretell's block kernel (PyTorch's int8 kernel has no fast fp32 path: 1.45 ms against 0.35 ms for the dense
    product of a 3072 x 576 layer at one row here), so "auto" is none where that kernel is not built. For a bf16
    draft on a CPU without a native bf16 matmul where foretell's bf16 kernel runs, "auto" is none: bf16 weights with
    that kernel were as fast at one row and up to ~2x faster at 2-8 rows (runtime/wide_linear.py)."""
    if mode not in QUANT_MODES:
        raise ForetellError(f"unknown draft quantization {mode!r}; use one of {', '.join(QUANT_MODES)}")
    if mode == "int4" and torch.device(device).type != "cpu":
        raise ForetellError("int4 drafts run on CPU only (foretell's int4 kernels); use int8 or auto here")
    if mode == "auto":
        if torch.device(device).type != "cpu":
            return "none"
        if dtype == torch.float32:
            return "none" if block_gemm() is None else "int8"
        if dtype == torch.bfloat16:
            threads = torch.get_num_threads()
            if wide_linear.fp32_wide_rows(threads) is not None and wide_linear.kernel_rows(threads) > 0:
                return "none"
        return "int8"
    return mode


def apply_quant(model: nn.Module, mode: str) -> nn.Module:
    """Quantize `model` in place per `mode` ("none", "int8" or "auto", see resolve_quant)."""
    first = next(model.parameters())
    return quantize_int8(model) if resolve_quant(mode, first.device, first.dtype) == "int8" else model
