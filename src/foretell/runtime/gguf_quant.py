"""A GGUF target keeping the quantization it ships with (quant="gguf"): the same weights llama.cpp runs.

Every projection (and the output layer) whose tensors are blocks keeps the file's own blocks:
- Q4_1 in every part: Int4Linear with the file's codes. GGUF's Q4_1 stores each row in blocks of 32 weights, a
  scale d and a minimum m (fp16) and 32 4-bit codes q with w = d * q + m: exactly the layout of PyTorch's int4 CPU
  kernel (W = (q - 8) * scale + offset in groups of 32: scale = d, offset = m + 8 d). With bf16 activations the
  kernel rounds d and m to bf16; with fp32 it is exact.
- a Q8_0 output layer: BlockQ8Linear (SmolLM2's Q4_1 file keeps its embedding, and so its tied output layer, so).
- any other mix of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K: GGUFLinear, the file's bytes as they are,
  run by kernels/lean_decode.cpp's GGUF kind (a Q4_K_M file's fused q, k, v mixes Q4_K and Q6_K).
Tensors the file stores unquantized (F32, F16, BF16) keep their dense layers, which hold their values. Any other
block type is refused, by name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from foretell.errors import ForetellError
from foretell.kernels import GGUF_KIND, Q8, lean_module
from foretell.layer_rows import dense_rows
from foretell.models.gguf_meta import GGUF_ARCHITECTURES, read_tensor_table
from foretell.runtime.quant import INT4_GROUP, Int4Linear, fp32_block_gemm, q4_1_blocks

Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of codes (two per byte)
Q8_0_BLOCK_BYTES = 34  # fp16 d, 32 int8 codes
# The block types GGUFLinear runs (their ggml numbers: lean_decode.cpp's GGUF kind reads them so)
BLOCK_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
DENSE_TYPES = ("F32", "F16", "BF16")  # not blocks: their layers stay dense
MAX_PARTS = 8  # the parts of one GGUF projection the kernel takes (kernels/lean/common.h's GGUF_MAX_PARTS)


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


def signed_codes(kind: int, raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes int8 [rows, cols] and scales d float32 [rows, cols / 32] of Q4_0, Q5_0 or Q8_0 blocks (ggml types 2, 6,
    8), all of the form w = d * code: the same weights as Q8_0 blocks, which the lean step's Q8X kernel multiplies
    at memory speed where the file's 5-bit rows ran compute-bound (~10 GB/s on 2 cores)."""
    if kind == BLOCK_TYPES["Q8_0"]:
        return q8_0_codes(raw, rows, cols)
    width = block_shape(kind)[1]  # bytes a block: fp16 d, (Q5_0: 4 bytes of fifth bits), 16 bytes of nibbles
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // 32, width)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = blocks[..., width - 16:].astype(np.int16)
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # inputs 0..15 low nibbles, 16..31 high
    if kind == BLOCK_TYPES["Q4_0"]:
        codes -= 8
    else:  # Q5_0: input j's fifth bit is bit j of the little-endian 32-bit qh
        qh = blocks[..., 2:6].copy().view("<u4")[..., 0].astype(np.int64)
        fifth = (qh[..., None] >> np.arange(32)) & 1
        codes = codes + 16 * fifth - 16
    return torch.from_numpy(codes.astype(np.int8).reshape(rows, cols)), torch.from_numpy(d)


class BlockQ8Linear(nn.Module):
    """A dense linear layer that also carries its GGUF Q8_0 blocks (w = d * code, 32 inputs a block), whose values
    it holds exactly: PyTorch passes use the dense weight, the lean step streams the 4x smaller blocks."""

    def __init__(self, dense: nn.Linear, codes: torch.Tensor, scales: torch.Tensor):
        super().__init__()
        self.dense = dense
        self.register_buffer("codes", codes)  # int8 [out, in]
        self.register_buffer("scales", scales)  # float32 [out, in / 32]

    @property
    def weight(self) -> torch.Tensor:
        return self.dense.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.dense.bias

    @property
    def out_features(self) -> int:
        return self.dense.out_features

    @property
    def in_features(self) -> int:
        return self.dense.in_features

    def select_rows(self, rows: torch.Tensor) -> BlockQ8Linear:
        """The layer restricted to some output rows (a hot vocabulary), the rows' own blocks kept: a draft model's
        hot output layer then streams a quarter of the dense bytes in the lean step too."""
        rows = rows.to(self.codes.device)
        return BlockQ8Linear(dense_rows(self.dense, rows), self.codes.index_select(0, rows).contiguous(),
                             self.scales.index_select(0, rows).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        gemm = fp32_block_gemm(flat) if self.dense.bias is None else None
        if gemm is None:
            return self.dense(x)
        # A few rows (verification): the blocks are a quarter of the dense fp32 bytes, and the same sums as the
        # lean step's
        return gemm(flat, Q8, self.codes, self.scales).view(*x.shape[:-1], self.out_features)


def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo the row order llama.cpp's converter gives Llama q / k projections (rotary halves interleaved)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


class GGUFLinear(nn.Module):
    """A projection holding a GGUF file's blocks as the file ships them, its rows in parts of one block type each
    (a fused q, k, v may mix types). Passes of a few float32 rows run lean_decode.cpp's block kernels on the bytes
    (the lean step's GGUF kind, the same products); more rows (a prompt) a dense product on the dequantized
    weight, made for the call (a prompt's products are made for many rows)."""

    def __init__(self, parts: list[tuple[int, torch.Tensor]], bias: torch.Tensor | None):
        """parts: (ggml type, bytes uint8 [rows, row bytes]) in row order; bias: [out] or None."""
        super().__init__()
        first_type, first = parts[0]
        self.in_features = row_inputs(first_type, first.shape[1])
        self.out_features = sum(rows.shape[0] for _, rows in parts)
        self.register_buffer("raw", torch.cat([rows.reshape(-1) for _, rows in parts]).contiguous())
        layout = [self.in_features] + [v for kind, rows in parts for v in (int(kind), rows.shape[0])]
        self.register_buffer("layout", torch.tensor(layout, dtype=torch.int64))  # lean_decode.cpp's GGUF layout
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def parts(self) -> list[tuple[int, torch.Tensor]]:
        """(ggml type, bytes [rows, row bytes]) of each part, views of the layer's bytes."""
        out, at = [], 0
        kinds, counts = self.layout[1::2].tolist(), self.layout[2::2].tolist()
        for kind, rows in zip(kinds, counts):
            size = rows * row_bytes(kind, self.in_features)
            out.append((kind, self.raw[at:at + size].view(rows, -1)))
            at += size
        return out

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [out, in] the blocks stand for: natively where the lean kernels are built, else by the
        gguf package's reference dequantization (the same values)."""
        module = lean_module()
        if module is not None:
            return module.dequantize_gguf(self.raw, self.layout)
        # start-up: gguf (~60 ms to import) is read only for GGUF files
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        return torch.cat([torch.from_numpy(dequantize(rows.numpy(), GGMLQuantizationType(kind)))
                          .view(rows.shape[0], self.in_features) for kind, rows in self.parts()])

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight, a float32 copy (for code that reads a layer's weight, not its products)."""
        return self.dequantized()

    def select_rows(self, rows: torch.Tensor) -> nn.Module:
        """The layer restricted to some output rows (a hot vocabulary of an output layer): the rows' own blocks."""
        rows = rows.cpu()
        parts = self.parts()
        ends = torch.tensor([part.shape[0] for _, part in parts]).cumsum(0)
        which = torch.bucketize(rows, ends, right=True)  # each row's part
        starts = torch.cat([torch.zeros(1, dtype=ends.dtype), ends[:-1]])
        cuts = [0] + (torch.nonzero(which[1:] != which[:-1]).flatten() + 1).tolist() + [rows.numel()]
        picked = []
        for a, b in zip(cuts[:-1], cuts[1:]):  # runs of rows from one part
            kind, part = parts[int(which[a])]
            picked.append((kind, part.index_select(0, rows[a:b] - starts[which[a]])))
        if len(picked) > MAX_PARTS:  # more parts than the kernel takes: the same values, dense
            dense = nn.Linear(self.in_features, rows.numel(), bias=self.bias is not None)
            with torch.no_grad():
                dense.weight.copy_(self.dequantized().index_select(0, rows))
                if self.bias is not None:
                    dense.bias.copy_(self.bias.index_select(0, rows))
            return dense.requires_grad_(False)
        return GGUFLinear(picked, None if self.bias is None else self.bias.index_select(0, rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()  # the blocks multiply float32 activations (a bf16 model's too)
        gemm = fp32_block_gemm(flat)
        if gemm is not None:
            y = gemm(flat.contiguous(), GGUF_KIND, self.raw, self.layout)
        else:
            y = F.linear(flat, self.dequantized())
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)


def block_shape(kind: int) -> tuple[int, int]:
    """(inputs, bytes) of one block of ggml type `kind`."""
    # start-up: gguf (~60 ms to import) is read only for GGUF files
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType(kind)]


def row_inputs(kind: int, nbytes: int) -> int:
    inputs, size = block_shape(kind)
    return nbytes // size * inputs


def row_bytes(kind: int, inputs: int) -> int:
    values, size = block_shape(kind)
    return inputs // values * size


def projection_tensors(arch: str, i: int) -> dict[str, list[str]]:
    """The file's tensors behind layer i's fused projections, in row order (llama.cpp's names; Phi-3's files fuse
    q, k, v and gate, up themselves)."""
    blk = f"blk.{i}"
    if arch == "phi3":
        attention, mlp = [f"{blk}.attn_qkv.weight"], [f"{blk}.ffn_up.weight"]
    else:
        attention, mlp = [f"{blk}.attn_{n}.weight" for n in "qkv"], [f"{blk}.ffn_gate.weight", f"{blk}.ffn_up.weight"]
    return {"qkv_proj": attention, "o_proj": [f"{blk}.attn_output.weight"], "gate_up_proj": mlp,
            "down_proj": [f"{blk}.ffn_down.weight"]}


def check_block_types(path: Path, tensors: dict, names) -> None:
    """Raise ForetellError naming the block types among `names`' tensors that foretell does not run."""
    unsupported: dict[str, str] = {}
    for name in names:
        kind = tensors[name].tensor_type.name
        if kind not in BLOCK_TYPES and kind not in DENSE_TYPES:
            unsupported.setdefault(kind, name)
    if unsupported:
        found = ", ".join(f"{kind} ({name})" for kind, name in sorted(unsupported.items()))
        raise ForetellError(f"{path.name} holds GGUF block types that --quant gguf does not run: {found}. It runs "
                            f"{', '.join(BLOCK_TYPES)} (and keeps {' / '.join(DENSE_TYPES)} tensors dense); use "
                            "--quant none (the file dequantized), int8 or int4")


def replaced_weights(gguf_path: str | Path) -> frozenset[str]:
    """The projection weights (the model's names, e.g. layers.0.qkv_proj.weight) that keep_gguf_quantization will
    replace by the file's blocks, so that loading need not read them from the converted float32 folder (for
    Qwen2.5-Coder-1.5B that read was ~5.5 GB and most of a minute). Empty where the native kernels are missing
    (then blocks may not replace every layer) or the file is not one foretell keeps."""
    if lean_module() is None:
        return frozenset()
    try:
        arch, tensors = read_tensor_table(Path(gguf_path))
    except ForetellError:
        return frozenset()  # keep_gguf_quantization reports the problem, after a plain load
    if arch not in GGUF_ARCHITECTURES:
        return frozenset()
    skipped = set()
    for i in range(max((int(n.split(".")[1]) + 1 for n in tensors if n.startswith("blk.")), default=0)):
        for name, names in projection_tensors(arch, i).items():
            if all(n in tensors and tensors[n].tensor_type.name in BLOCK_TYPES for n in names):
                skipped.add(f"layers.{i}.{name}.weight")
    return frozenset(skipped)


def check_replaced(model, skipped: frozenset[str]) -> None:
    """Every weight left unread at load now belongs to a layer of blocks (an unread dense weight is uninitialised
    memory: its layer must be gone)."""
    stale = [name for name in sorted(skipped) if type(model.get_submodule(name.rsplit(".", 1)[0])) is nn.Linear]
    if stale:
        raise ForetellError(f"internal error: {stale[0]} was left unread at load but its layer was not replaced by "
                            "quantized layers; please report it (--quant none meanwhile)")


def keep_gguf_quantization(model, gguf_path: str | Path) -> list[str]:
    """Replace the model's projections and output layer whose GGUF tensors are blocks by layers holding the file's
    own blocks (the module docstring says which); returns the names of the layers replaced."""
    path = Path(gguf_path)
    arch, tensors = read_tensor_table(path)
    if arch not in GGUF_ARCHITECTURES:
        raise ForetellError(f"keeping a GGUF file's quantization is supported for {', '.join(GGUF_ARCHITECTURES)} "
                            f"files, not {arch!r}; use --quant int4 (foretell's own int4) or none")
    if model.device.type != "cpu":
        raise ForetellError(f"--quant gguf runs the file's blocks on CPU, not {model.device.type}; use int8 or none")
    c = model.config
    plan = {f"layers.{i}.{name}": names for i in range(len(model.layers))
            for name, names in projection_tensors(arch, i).items()}
    plan["lm_head"] = ["output.weight" if "output.weight" in tensors else "token_embd.weight"]
    missing = [n for names in plan.values() for n in names if n not in tensors]
    if missing:
        raise ForetellError(f"{path.name} has no tensor {missing[0]}: the file does not match its architecture")
    check_block_types(path, tensors, [n for names in plan.values() for n in names])
    heads = {"attn_q": c.num_attention_heads, "attn_k": c.num_key_value_heads} if arch == "llama" else {}
    native = lean_module() is not None  # else GGUFLinear's layers stay dense: the same values
    replaced = []
    for target, names in plan.items():
        kinds = [tensors[n].tensor_type.name for n in names]
        if any(kind in DENSE_TYPES for kind in kinds):
            continue  # (part) unquantized: the dense layer holds the file's values
        old = model.get_submodule(target)
        parts = [file_rows(tensors[n], heads.get(n.split(".")[-2])) for n in names]
        shape = (sum(rows.shape[0] for _, rows in parts), row_inputs(parts[0][0], parts[0][1].shape[1]))
        if shape != (old.out_features, old.in_features):
            raise ForetellError(f"GGUF tensors for {target} have shape {shape}, the model "
                                f"{(old.out_features, old.in_features)}: the file does not match its config")
        new = kept_layer(target, kinds, parts, old, native)
        if new is not None:
            model.set_submodule(target, new)
            replaced.append(target)
    if not replaced:
        raise ForetellError(f"{path.name} has no quantized projections to keep; use --quant int4 or none")
    return replaced


def file_rows(tensor, heads: int | None) -> tuple[int, torch.Tensor]:
    """(ggml type, the tensor's blocks uint8 [rows, row bytes]) in the model's row order (llama.cpp's converter
    interleaves the rotary halves of Llama's q / k rows: undone here, on whole rows of blocks)."""
    rows = torch.from_numpy(np.array(tensor.data, dtype=np.uint8).reshape(int(tensor.shape[1]), -1))
    return int(tensor.tensor_type), rows if heads is None else unpermute_rows(rows, heads).contiguous()


def kept_layer(target: str, kinds: list[str], parts: list[tuple[int, torch.Tensor]], old: nn.Module,
               native: bool) -> nn.Module | None:
    """The layer holding `parts` in place of `old` (None: `old` stays)."""
    bias = old.bias
    if all(k == "Q4_1" for k in kinds) and target != "lm_head" and old.out_features % 16 == 0:
        q, d, m = (torch.cat(pieces) for pieces in zip(*(q4_1_codes(rows.numpy(), rows.shape[0], old.in_features)
                                                         for _, rows in parts)))
        new = Int4Linear.from_codes(q, d, m + 8 * d, bias, INT4_GROUP)
        new.blocks = q4_1_blocks(q, d, m)  # the file's own (d, m) for fp32 activations, not re-derived ones
        return new
    if kinds == ["Q8_0"] and target == "lm_head" and type(old) is nn.Linear:
        # The dense output layer already holds these blocks' values (dequantized from the file); the blocks let the
        # lean step stream a quarter of the fp32 bytes, in its Q8 kinds (runtime/lean_step.py)
        codes, d = q8_0_codes(parts[0][1].numpy(), old.out_features, old.in_features)
        return BlockQ8Linear(old, codes, d)
    return GGUFLinear(parts, bias) if native else None
