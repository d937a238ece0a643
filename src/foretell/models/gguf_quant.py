"""A GGUF target keeping the 4-bit quantization it ships with, where PyTorch has a kernel for it.

GGUF's Q4_1 stores each row in blocks of 32 weights: a scale d and a minimum m (fp16) and 32 4-bit codes q, with
w = d * q + m. That is exactly the layout of PyTorch's int4 CPU kernel (W = (q - 8) * scale + offset in groups of
32: scale = d, offset = m + 8 d), so Q4_1 projections load as Int4Linear with the file's own codes: the same
weights llama.cpp runs, not a re-quantization. Other block types (Q8_0's per-block int8, K-quants) have no
PyTorch kernel; those layers stay dequantized in the model's dtype (SmolLM2's Q4_1 file keeps its embedding, and
so its tied output layer, in Q8_0). With bf16 activations the kernel rounds d and m to bf16; with fp32 it is exact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from foretell.errors import ForetellError
from foretell.models.quant import INT4_GROUP, Int4Linear

Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of codes (two per byte)
Q8_0_BLOCK_BYTES = 34  # fp16 d, 32 int8 codes


def q4_1_codes(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes [rows, cols] (0..15), scales d and minima m [rows, cols / 32] of a Q4_1 tensor's raw bytes."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // INT4_GROUP, Q4_1_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = blocks[..., 4:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # block values 0..15 low nibbles, 16..31 high
    return torch.from_numpy(codes.reshape(rows, cols).astype(np.int32)), torch.from_numpy(d), torch.from_numpy(m)


def q8_0_codes(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes int8 [rows, cols] and scales d float32 [rows, cols / 32] of a Q8_0 tensor's raw bytes (w = d * code)."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // INT4_GROUP, Q8_0_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
    return torch.from_numpy(codes), torch.from_numpy(d)


def q4_1_blocks(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [rows, cols] 0..15 and d, m [rows, cols / 32] in the block layout models/lean_step.py reads."""
    blocks = q.to(torch.uint8).view(q.shape[0], -1, 2, 16)
    packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(q.shape[0], -1).contiguous()
    return packed, torch.stack([d.float(), m.float()], dim=-1).contiguous()


def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo the row order llama.cpp's converter gives Llama q / k projections (rotary halves interleaved)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def keep_gguf_quantization(model, gguf_path: str | Path) -> list[str]:
    """Replace the model's projections whose GGUF tensors are all Q4_1 by Int4Linear layers holding the file's
    own codes; returns the names of the layers replaced."""
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(str(gguf_path))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    if arch != "llama":
        raise ForetellError(f"keeping a GGUF file's quantization is supported for Llama-architecture files, not {arch!r}; "
                            "use --quant int4 (foretell's own int4) or none")
    tensors = {t.name: t for t in reader.tensors}
    c = model.config

    def codes(name: str, heads: int | None = None):
        t = tensors[name]
        if t.tensor_type != GGMLQuantizationType.Q4_1:
            return None
        rows, cols = int(t.shape[1]), int(t.shape[0])  # GGUF lists dimensions innermost first
        q, d, m = q4_1_codes(t.data, rows, cols)
        if heads is not None:
            q, d, m = (unpermute_rows(x, heads) for x in (q, d, m))
        return q, d, m

    replaced = []
    for i, layer in enumerate(model.layers):
        parts = {
            "qkv_proj": [codes(f"blk.{i}.attn_q.weight", c.num_attention_heads),
                         codes(f"blk.{i}.attn_k.weight", c.num_key_value_heads), codes(f"blk.{i}.attn_v.weight")],
            "o_proj": [codes(f"blk.{i}.attn_output.weight")],
            "gate_up_proj": [codes(f"blk.{i}.ffn_gate.weight"), codes(f"blk.{i}.ffn_up.weight")],
            "down_proj": [codes(f"blk.{i}.ffn_down.weight")],
        }
        for name, pieces in parts.items():
            if any(p is None for p in pieces):
                continue  # another block type: stays dense
            old = getattr(layer, name)
            q, d, m = (torch.cat([p[k] for p in pieces]) for k in range(3))
            if tuple(q.shape) != (old.out_features, old.in_features) or q.shape[0] % 16:
                raise ForetellError(f"GGUF tensor for layer {i} {name} has shape {tuple(q.shape)}, the model "
                                    f"{(old.out_features, old.in_features)}: the file does not match its config")
            new = Int4Linear.from_codes(q.to(old.weight.device), d, m + 8 * d, old.bias, INT4_GROUP)
            new.blocks = q4_1_blocks(q, d, m)  # the file's own (d, m) for fp32 activations, not re-derived ones
            setattr(layer, name, new)
            replaced.append(f"layers.{i}.{name}")
    if not replaced:
        raise ForetellError(f"{gguf_path} has no Q4_1 projections to keep; use --quant int4 or none")
    head = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if head is not None and head.tensor_type == GGMLQuantizationType.Q8_0 and type(model.lm_head) is torch.nn.Linear:
        # The dense output layer already holds these blocks' values (dequantized from the file); the blocks let the
        # lean one-token step stream a quarter of the fp32 bytes (models/lean_step.py).
        codes, d = q8_0_codes(head.data, int(head.shape[1]), int(head.shape[0]))
        if tuple(codes.shape) == tuple(model.lm_head.weight.shape):
            from foretell.models.lean_step import BlockQ8Linear

            model.lm_head = BlockQ8Linear(model.lm_head, codes.to(model.lm_head.weight.device), d)
            replaced.append("lm_head")
    return replaced
