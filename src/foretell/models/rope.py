"""Rotary position tables: the default RoPE and the scalings checkpoints ship with.

The math follows transformers' modeling_rope_utils.py (5.x) type by type, so a checkpoint rotates exactly as it
does there: `linear` (position interpolation), `dynamic` (NTK-aware), `yarn`, `llama3` (Llama 3.1+) and
`longrope` (Phi-3 / Phi-4-mini). Tables are built once per length and indexed by position.

Two types depend on the sequence length in transformers: `dynamic` recomputes its frequencies once a forward
reaches past max_position_embeddings, and `longrope` switches from its short to its long factors past
original_max_position_embeddings. Both look at the longest position *of the current forward*, so there a result
would depend on how tokens were split into forwards, and speculation could not be lossless. Here each position
uses the frequencies its own length selects (position p as if the sequence were p + 1 tokens long). That is
exactly what transformers' forward with a cache computes when the prompt fits the unscaled range and tokens then
come one at a time (test_families.py); a single forward over a longer prompt differs, and so does Phi-3's
`generate`, which recomputes its whole cache with the long factors once the sequence outgrows the short range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from foretell.errors import ForetellError

SCALED_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    """transformers' `rope_parameters` for a scaled RoPE, less rope_theta (kept in ModelConfig)."""

    rope_type: str  # one of SCALED_TYPES
    factor: float | None = None
    original_max_position_embeddings: int | None = None  # yarn, llama3, longrope
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    attention_factor: float | None = None  # yarn, longrope: cos and sin are multiplied by it
    beta_fast: float | None = None  # yarn
    beta_slow: float | None = None  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    short_factor: tuple[float, ...] = ()  # longrope
    long_factor: tuple[float, ...] = ()  # longrope

    def __post_init__(self):
        if self.rope_type not in SCALED_TYPES:
            raise ForetellError(
                f"rope scaling {self.rope_type!r} is not supported; foretell runs default RoPE and {', '.join(SCALED_TYPES)}"
            )
        object.__setattr__(self, "short_factor", tuple(float(x) for x in self.short_factor))
        object.__setattr__(self, "long_factor", tuple(float(x) for x in self.long_factor))

    @classmethod
    def from_hf(cls, params: dict) -> "RopeScaling | None":
        """From one (flat) `rope_parameters` dict as transformers' configuration classes standardise it."""
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type in ("default", None):
            return None
        known = {f for f in cls.__dataclass_fields__ if f != "rope_type"}
        ignored = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
        unknown = sorted(set(params) - known - ignored)
        if unknown:
            raise ForetellError(f"rope scaling {rope_type!r} with parameters {unknown} is not supported")
        return cls(rope_type=rope_type, **{k: v for k, v in params.items() if k in known and v is not None})


def inverse_frequencies(dim: int, theta: float) -> torch.Tensor:
    """[dim / 2] float32: the default RoPE's theta ** (-2i / dim)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    old_len = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / s.low_freq_factor, old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, theta: float, s: RopeScaling, max_positions: int) -> tuple[torch.Tensor, float]:
    original = s.original_max_position_embeddings
    factor = s.factor if s.factor is not None else max_positions / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.attention_factor
    if attention is None:
        attention = float(mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim)) if s.mscale and s.mscale_all_dim \
            else mscale(factor)
    beta_fast, beta_slow = s.beta_fast or 32, s.beta_slow or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no division by zero in the ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # the share of each frequency left unscaled
    return interpolation * (1 - keep) + extrapolation * keep, attention


def _per_position_angles(positions: torch.Tensor, inv_freq_at: torch.Tensor) -> torch.Tensor:
    """angles [S, dim / 2] when each position has its own inverse frequencies [S, dim / 2]."""
    return positions.float()[:, None] * inv_freq_at


def rope_tables(
    dim: int, theta: float, length: int, device, scaling: RopeScaling | None = None, max_positions: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, dim] float32 (the rotate-half layout) for positions 0..length - 1.

    dim: the rotated width of a head (head_dim, or less with a partial rotary factor). max_positions: the
    checkpoint's max_position_embeddings (dynamic and yarn / longrope defaults read it).
    """
    # Built on the CPU once per length (deterministic on every device), then moved.
    positions = torch.arange(length, dtype=torch.float32)
    inv = inverse_frequencies(dim, theta)
    attention = 1.0
    kind = scaling.rope_type if scaling is not None else "default"
    if kind == "default":
        angles = torch.outer(positions, inv)
    elif kind == "linear":
        angles = torch.outer(positions, inv / scaling.factor)
    elif kind == "llama3":
        angles = torch.outer(positions, _llama3(inv, scaling))
    elif kind == "yarn":
        inv, attention = _yarn(dim, theta, scaling, max_positions)
        angles = torch.outer(positions, inv)
    elif kind == "dynamic":
        # NTK base for a sequence of max(p + 1, max_positions) tokens; up to max_positions it is the default.
        seq = torch.arange(1, length + 1).clamp(min=max_positions)
        base = theta * ((scaling.factor * seq / max_positions) - (scaling.factor - 1)) ** (dim / (dim - 2))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        angles = _per_position_angles(positions, 1.0 / (base[:, None] ** exponents[None, :]))
    else:  # longrope: short factors while p + 1 <= original length, long factors after
        original = scaling.original_max_position_embeddings
        factor = scaling.factor if scaling.factor is not None else max_positions / original
        attention = scaling.attention_factor
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        short = 1.0 / (torch.tensor(scaling.short_factor, dtype=torch.float32) * theta**shape)
        long = 1.0 / (torch.tensor(scaling.long_factor, dtype=torch.float32) * theta**shape)
        beyond = (torch.arange(1, length + 1) > original)[:, None]
        angles = _per_position_angles(positions, torch.where(beyond, long, short))
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(device) * attention, angles.sin().to(device) * attention
