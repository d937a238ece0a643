"""Run the target (p) once over the training sequences and keep, per token, its top-k log-probabilities.

Student stages then read p from disk instead of rerunning the target. The arrays are .npy files
opened as memory maps: written in order, readable at any row without loading the whole cache,
and shared between the processes of a distributed run. meta.json counts the rows written, so an
interrupted pass continues where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from foretell.errors import ForetellError
from foretell.models.transformer import Transformer
from foretell.train.data import TokenData

META = "meta.json"


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
        return cls(*open_arrays(folder, ("logp", "ids", "lse"), "teacher cache", "the distill command"))


def open_arrays(folder: Path, names: tuple[str, ...], what: str, command: str) -> list[np.ndarray]:
    """Memory-map the finished arrays `names` of a cache folder, or fail saying how to repair it."""
    meta = read_meta(folder)
    if meta is None or meta["done"] != meta["num_sequences"]:
        raise ForetellError(f"{what} in {folder} is missing or incomplete; rerun {command} to finish it")
    try:
        return [np.load(folder / f"{name}.npy", mmap_mode="r") for name in names]
    except (OSError, ValueError) as e:
        raise ForetellError(f"{what} in {folder} is corrupt ({e}); delete the folder and rerun") from None


def read_meta(folder: Path) -> dict | None:
    try:
        return json.loads((folder / META).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        raise ForetellError(f"{folder / META} is corrupt; delete {folder} and rerun") from None


def write_meta(folder: Path, meta: dict) -> None:
    tmp = folder / (META + ".partial")
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(folder / META)


@torch.no_grad()
def topk_log_probs(target: Transformer, input_ids: torch.Tensor, k: int):
    """p's top-k log-probabilities [B, T, k], their ids and the log-normaliser [B, T], in float32."""
    return topk_of_logits(target.forward_sequences(input_ids.to(target.device)).logits, k)


def topk_of_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k log-probabilities [..., k], their ids and the log-normaliser [...], in float32."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    top, ids = logits.topk(k, dim=-1)
    return top - lse[..., None], ids, lse


def build_teacher_cache(target: Transformer, data: TokenData, folder: Path, cfg: TeacherConfig,
                        fingerprint: dict) -> TeacherCache:
    """Fill (or finish) the cache in `folder`; `fingerprint` names the target and data it belongs to."""
    n, t = data.input_ids.shape
    k = min(cfg.top_k, target.config.vocab_size)
    want = {"num_sequences": n, "seq_len": t, "top_k": k, "fingerprint": fingerprint}
    meta = read_meta(folder)
    if meta is not None and {key: meta.get(key) for key in want} != want:
        raise ForetellError(f"teacher cache in {folder} was made for other settings; delete it or use another --out")
    folder.mkdir(parents=True, exist_ok=True)
    if meta is None:
        for name, shape, dtype in (("logp", (n, t, k), np.float32), ("ids", (n, t, k), np.int32), ("lse", (n, t), np.float32)):
            np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=dtype, shape=shape).flush()
        meta = {**want, "done": 0}
        write_meta(folder, meta)
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r+") for name in ("logp", "ids", "lse")}
    target.eval()
    with tqdm(total=n, initial=meta["done"], desc="teacher top-k", unit="seq") as bar:
        for start in range(meta["done"], n, cfg.batch_size):
            end = min(start + cfg.batch_size, n)
            logp, ids, lse = topk_log_probs(target, data.input_ids[start:end], k)
            arrays["logp"][start:end] = logp.cpu().numpy()
            arrays["ids"][start:end] = ids.cpu().numpy().astype(np.int32)
            arrays["lse"][start:end] = lse.cpu().numpy()
            for a in arrays.values():
                a.flush()
            meta["done"] = end  # only after the rows are on disk
            write_meta(folder, meta)
            bar.update(end - start)
    return TeacherCache.open(folder)


@torch.no_grad()
def per_token_kl(model: Transformer, data: TokenData, cache: TeacherCache, batch_size: int) -> torch.Tensor:
    """KL(p || q_model) [N, T] at every position (the reference model's loss, fixed once it is trained)."""
    from foretell.train.losses import topk_kl

    model.eval()
    out = torch.zeros(data.input_ids.shape, dtype=torch.float32)
    for start in tqdm(range(0, len(data), batch_size), desc="reference KL", unit="batch"):
        index = torch.arange(start, min(start + batch_size, len(data)))
        logp, ids = cache.rows(index)
        logits = model.forward_sequences(data.input_ids[index].to(model.device)).logits
        out[index] = topk_kl(logits, logp.to(model.device), ids.to(model.device)).cpu()
    return out


def fingerprint_of(folder: Path) -> dict:
    """Identifies a model by the sha256 of its weights (a copied folder is the same model; a
    fine-tuned one with the same shapes is not). Reading the weights once costs far less than a teacher pass."""
    import hashlib

    digest = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            while block := fh.read(1 << 24):
                digest.update(block)
    return {"weights_sha256": digest.hexdigest()}
