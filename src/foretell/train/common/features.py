"""The target's features, extracted once for the drafters that read them: hidden states and top-k p.

Per training token: the hidden states of the hooked layers side by side (bf16; the parallel head's
fuse_layers, or the hidden-state draft's last layer), and the target's top-k next-token
log-probabilities with their ids (the soft targets, common/topk.py). Both come from one target
forward per batch. The cache is a resumable folder of .npy memory maps (common/cache.py): bounded
RAM, readable at any row, an interrupted pass continues where it stopped.
Disk: N x T x (len(fuse_layers) x H x 2 + 8k) bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from foretell.models.transformer import Transformer
from foretell.train.common.cache import fill_cache, open_arrays, read_meta
from foretell.train.common.data import TokenData
from foretell.train.common.distributed import DistContext
from foretell.train.common.topk import sequence_topk

ARRAYS = ("features", "logp", "ids")


@dataclass(frozen=True)
class FeatureConfig:
    top_k: int = 32  # target log-probs kept per token (the rest is one tail bucket in the KL)
    batch_size: int = 4  # sequences per target forward
    dtype: str = "float32"  # the target's dtype for this pass (bfloat16 is ~2x faster on bf16 CPUs)


@dataclass
class FeatureCache:
    """features: [N, T, F] int16 holding bf16 bits (F = len(fuse_layers) * H); logp: [N, T, k]
    float32 top-k log p, descending; ids: [N, T, k] int32 their token ids."""

    features: np.ndarray
    logp: np.ndarray
    ids: np.ndarray

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sequence i's features [T, F] bf16, top-k log p [T, k] and ids [T, k] long."""
        features = torch.from_numpy(np.array(self.features[i])).view(torch.bfloat16)  # a copy: the map is read-only
        return features, torch.from_numpy(np.array(self.logp[i])), torch.from_numpy(self.ids[i].astype(np.int64))

    @classmethod
    def open(cls, folder: Path) -> FeatureCache:
        return cls(*open_arrays(folder, ARRAYS, "feature cache", "the command"))


@torch.no_grad()
def extract_batch(target: Transformer, input_ids: torch.Tensor, fuse_layers: tuple[int, ...], k: int):
    """Fused hidden states [B, T, F] bf16, top-k log p [B, T, k] float32 and their ids, from one forward."""
    logp, ids, _, hidden = sequence_topk(target, input_ids, k, fuse_layers)
    features = torch.cat([hidden[layer] for layer in fuse_layers], dim=-1).to(torch.bfloat16)
    return features, logp, ids


def cache_bytes(num_sequences: int, seq_len: int, feature_size: int, top_k: int) -> int:
    return num_sequences * seq_len * (2 * feature_size + 8 * top_k)


def cache_settings(data: TokenData, fuse_layers: tuple[int, ...], top_k: int, fingerprint: dict) -> dict:
    """What a cache must have been made with to be reused (fingerprint: the target's weights and the data)."""
    n, t = data.input_ids.shape
    return {"num_sequences": n, "seq_len": t, "top_k": top_k, "fuse_layers": list(fuse_layers), "fingerprint": fingerprint}


def open_if_complete(folder: Path, want: dict) -> FeatureCache | None:
    meta = read_meta(folder)
    if meta is None or meta["done"] != meta["num_sequences"] or {key: meta.get(key) for key in want} != want:
        return None
    return FeatureCache.open(folder)


def build_feature_cache(target: Transformer, data: TokenData, fuse_layers: tuple[int, ...], folder: Path,
                        cfg: FeatureConfig, fingerprint: dict, ctx: DistContext | None = None) -> FeatureCache:
    """Fill (or finish) the cache in `folder`; `fingerprint` names the target and data it belongs to. With
    several processes (ctx) each computes its own block of sequences (common/cache.py)."""
    n, t = data.input_ids.shape
    k = min(cfg.top_k, target.config.vocab_size)
    f = len(fuse_layers) * target.config.hidden_size
    want = cache_settings(data, fuse_layers, k, fingerprint)
    target.eval()

    def rows(start: int, end: int) -> dict[str, np.ndarray]:
        features, logp, ids = extract_batch(target, data.input_ids[start:end], fuse_layers, k)
        return {"features": features.cpu().view(torch.int16).numpy(), "logp": logp.cpu().numpy(),
                "ids": ids.cpu().numpy().astype(np.int32)}

    arrays = (("features", (n, t, f), np.int16), ("logp", (n, t, k), np.float32), ("ids", (n, t, k), np.int32))
    fill_cache(folder, want, arrays, cfg.batch_size, rows, "target features",
               f"feature cache in {folder} was made for another target, data or head; delete it or use another --out",
               f"foretell train: target features for {n} sequences x {t} tokens "
               f"({cache_bytes(n, t, f, k) / 2**30:.2f} GiB) -> {folder}", ctx)
    return FeatureCache.open(folder)
