"""GGUF blocks of a float weight for tests: gguf.quants.quantize where the gguf package quantizes (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0), and a plain min / max quantizer for the K-quants it only dequantizes (Q4_K, Q5_K, Q6_K), writing the
layouts its reference dequantization reads. Q2_K, which foretell does not run, as zero blocks."""

from __future__ import annotations

import numpy as np

gguf = __import__("pytest").importorskip("gguf")
T = gguf.GGMLQuantizationType


def f16(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float16)


def safe(x: np.ndarray) -> np.ndarray:
    return np.where(x == 0, 1, x)


def k_scales(scale: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """The 12 bytes of a K-quant block's eight 6-bit scales and mins [blocks, 8]: the low 6 bits of chunks 0-3 in
    bytes 0-3 (scales) and 4-7 (mins), chunks 4-7's low 4 bits in bytes 8-11, their top 2 bits in the top bits of
    bytes 0-7."""
    sc, mn = scale.astype(np.uint8), mins.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def pack_k(w: np.ndarray, bits: int) -> np.ndarray:
    """Q4_K (bits 4) or Q5_K (bits 5) blocks of w: per 32 inputs a scale and a min in 6-bit steps of d and dmin."""
    top = 2 ** bits - 1
    chunks = w.reshape(-1, 8, 32)
    low = np.minimum(chunks.min(-1), 0)
    step = (chunks.max(-1) - low) / top
    d = f16(step.max(-1) / 63).astype(np.float32)
    dmin = f16(-low.min(-1) / 63).astype(np.float32)
    sc = np.clip(np.round(step / safe(d)[:, None]), 0, 63)
    mn = np.clip(np.round(-low / safe(dmin)[:, None]), 0, 63)
    scale, offset = (d[:, None] * sc)[..., None], (dmin[:, None] * mn)[..., None]
    q = np.clip(np.round((chunks + offset) / safe(scale)), 0, top).astype(np.uint8)
    pairs = q.reshape(-1, 4, 2, 32)  # chunks 2i, 2i + 1: the low and high nibbles of 32 bytes
    nibbles = ((pairs[:, :, 0] & 0x0F) | ((pairs[:, :, 1] & 0x0F) << 4)).reshape(-1, 128)
    parts = [f16(d).view(np.uint8).reshape(-1, 2), f16(dmin).view(np.uint8).reshape(-1, 2), k_scales(sc, mn)]
    if bits == 5:  # bit j of byte l: the fifth bit of input l of chunk j
        fifth = (q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]
        parts.append(fifth.sum(1).astype(np.uint8))
    return np.concatenate(parts + [nibbles], axis=1)


def pack_q6_k(w: np.ndarray) -> np.ndarray:
    """Q6_K blocks of w: per 16 inputs an int8 scale in steps of d, codes 0..63 standing for -32..31."""
    groups = w.reshape(-1, 16, 16)
    step = np.abs(groups).max(-1) / 31
    d = f16(step.max(-1) / 127).astype(np.float32)
    sc = np.clip(np.round(step / safe(d)[:, None]), -128, 127)
    scale = (d[:, None] * sc)[..., None]
    q = (np.clip(np.round(groups / safe(scale)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    # per half of 128 inputs: 64 bytes of nibbles (inputs l, 32 + l low; 64 + l, 96 + l high), 32 of bit pairs
    nibbles = np.concatenate([(q[:, :, 0] & 0x0F) | ((q[:, :, 2] & 0x0F) << 4),
                              (q[:, :, 1] & 0x0F) | ((q[:, :, 3] & 0x0F) << 4)], axis=-1)
    pairs = sum((q[:, :, k] >> 4) << (2 * k) for k in range(4)).astype(np.uint8)
    return np.concatenate([nibbles.reshape(-1, 128), pairs.reshape(-1, 64), sc.astype(np.int8).view(np.uint8),
                           f16(d).view(np.uint8).reshape(-1, 2)], axis=1)


def quantize(w: np.ndarray, kind) -> np.ndarray:
    """w [rows, K] as GGUF blocks of `kind`: uint8 [rows, row bytes]."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    rows = w.shape[0]
    if kind == T.Q4_K:
        return pack_k(w, 4).reshape(rows, -1)
    if kind == T.Q5_K:
        return pack_k(w, 5).reshape(rows, -1)
    if kind == T.Q6_K:
        return pack_q6_k(w).reshape(rows, -1)
    if kind == T.Q2_K:
        return np.zeros((rows, w.shape[1] // 256 * 84), dtype=np.uint8)
    return gguf.quants.quantize(w, kind)
