"""Run the target (p) once over the training sequences and keep, per token, its top-k log-probabilities.

Student stages then read p from disk instead of rerunning the target. The cache is a resumable
folder of memory-mapped .npy arrays (common/cache.py): an interrupted pass continues where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from foretell.models.transformer import Transformer
from foretell.train.common.cache import fill_cache, open_arrays
from foretell.train.common.data import TokenData
from foretell.train.common.topk import sequence_topk, topk_kl


@dataclass(frozen=True)
class TeacherConfig:
    top_k: int = 32
    batch_size: int = 4  # sequences per target forward (the [B, T, V] logits dominate memory)
    dtype: str = "float32"  # bfloat16 runs the target about 2x faster on CPUs with bf16 units


@dataclass
class TeacherCache:
    """logp: [N, T, k] float32 top-k log p, descending; ids: [N, T, k] int32 their token ids;
    lse: [N, T] float32 log-normaliser of the target logits (logits = logp + lse)."""

    logp: np.ndarray
    ids: np.ndarray
    lse: np.ndarray

    @property
    def top_k(self) -> int:
        return self.logp.shape[-1]

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = index.numpy()
        return torch.from_numpy(self.logp[idx]), torch.from_numpy(self.ids[idx].astype(np.int64))

    @classmethod
    def open(cls, folder: Path) -> TeacherCache:
        return cls(*open_arrays(folder, ("logp", "ids", "lse"), "teacher cache", "the train adaspec command"))


@torch.no_grad()
def topk_log_probs(target: Transformer, input_ids: torch.Tensor, k: int):
    """p's top-k log-probabilities [B, T, k], their ids and the log-normaliser [B, T], in float32."""
    return sequence_topk(target, input_ids, k)[:3]


def build_teacher_cache(target: Transformer, data: TokenData, folder: Path, cfg: TeacherConfig,
                        fingerprint: dict) -> TeacherCache:
    """Fill (or finish) the cache in `folder`; `fingerprint` names the target and data it belongs to."""
    n, t = data.input_ids.shape
    k = min(cfg.top_k, target.config.vocab_size)
    want = {"num_sequences": n, "seq_len": t, "top_k": k, "fingerprint": fingerprint}
    target.eval()

    def rows(start: int, end: int) -> dict[str, np.ndarray]:
        logp, ids, lse = topk_log_probs(target, data.input_ids[start:end], k)
        return {"logp": logp.cpu().numpy(), "ids": ids.cpu().numpy().astype(np.int32), "lse": lse.cpu().numpy()}

    arrays = (("logp", (n, t, k), np.float32), ("ids", (n, t, k), np.int32), ("lse", (n, t), np.float32))
    fill_cache(folder, want, arrays, cfg.batch_size, rows, "teacher top-k",
               f"teacher cache in {folder} was made for other settings; delete it or use another --out")
    return TeacherCache.open(folder)


@torch.no_grad()
def per_token_kl(model: Transformer, data: TokenData, cache: TeacherCache, batch_size: int) -> torch.Tensor:
    """KL(p || q_model) [N, T] at every position (the reference model's loss, fixed once it is trained)."""
    model.eval()
    out = torch.zeros(data.input_ids.shape, dtype=torch.float32)
    for start in tqdm(range(0, len(data), batch_size), desc="reference KL", unit="batch"):
        index = torch.arange(start, min(start + batch_size, len(data)))
        logp, ids = cache.rows(index)
        logits = model.forward_sequences(data.input_ids[index].to(model.device)).logits
        out[index] = topk_kl(logits, logp.to(model.device), ids.to(model.device)).cpu()
    return out

