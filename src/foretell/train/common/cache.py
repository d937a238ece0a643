"""Resumable on-disk caches of per-token target outputs, and the fingerprint that ties one to its model.

A cache is a folder of .npy arrays opened as memory maps (written in order, readable at any row
without loading the whole cache, shared between the processes of a distributed run) plus
meta.json, which counts the rows written, so an interrupted pass continues where it stopped.
AdaSPEC's teacher cache and the feature cache of parallel-head and hidden-state training are both kept this way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import hashlib
from typing import Callable

import numpy as np
from tqdm import tqdm

from foretell.errors import ForetellError
from foretell.train.common.distributed import DistContext

META = "meta.json"


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


def fingerprint_of(folder: Path) -> dict:
    """Identifies a model by the sha256 of its weights (a copied folder is the same model; a
    fine-tuned one with the same shapes is not). Reading the weights once costs far less than a teacher pass."""
    digest = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            while block := fh.read(1 << 24):
                digest.update(block)
    return {"weights_sha256": digest.hexdigest()}


def fill_cache(folder: Path, want: dict, arrays: tuple[tuple[str, tuple[int, ...], type], ...], batch_size: int,
               rows: Callable[[int, int], dict[str, np.ndarray]], desc: str, mismatch: str, announce: str = "",
               ctx: DistContext | None = None) -> None:
    """Create the arrays (name, shape, dtype) of a cache folder made with settings `want`, or continue them:
    rows(start, end) computes sequences start..end-1 of each array; meta.json counts the rows on disk, so
    an interrupted pass resumes where it stopped. A folder made with other settings is refused (`mismatch`).

    With several processes (ctx) the rows not yet done are sharded: each process computes a contiguous block
    of them and writes exactly its bytes (positioned writes, safe on a shared filesystem), keeping its own
    progress file, so an interrupted sharded pass resumes with the same number of processes; once every
    block is on disk the main process marks the cache complete."""
    ctx = ctx or DistContext()
    n = want["num_sequences"]
    meta = read_meta(folder)
    if meta is not None and {key: meta.get(key) for key in want} != want:
        raise ForetellError(mismatch)
    if ctx.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        if meta is None:
            for name, shape, dtype in arrays:
                np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=dtype, shape=shape).flush()
            write_meta(folder, {**want, "done": 0})
    ctx.barrier()
    meta = read_meta(folder)
    if meta["done"] < n and announce and ctx.is_main:
        print(announce)
    if ctx.active:
        _fill_shard(folder, meta, arrays, batch_size, rows, desc, ctx)
        return
    maps = {name: np.load(folder / f"{name}.npy", mmap_mode="r+") for name, _, _ in arrays}
    with tqdm(total=n, initial=meta["done"], desc=desc, unit="seq") as bar:
        for start in range(meta["done"], n, batch_size):
            end = min(start + batch_size, n)
            for name, values in rows(start, end).items():
                maps[name][start:end] = values
            for m in maps.values():
                m.flush()
            meta["done"] = end  # only after the rows are on disk
            write_meta(folder, meta)
            bar.update(end - start)


def shard_bounds(done: int, n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous block of rows done..n-1 that process `rank` of `world` computes."""
    size = n - done
    return done + size * rank // world, done + size * (rank + 1) // world


def _fill_shard(folder: Path, meta: dict, arrays, batch_size: int, rows, desc: str, ctx: DistContext) -> None:
    n = meta["num_sequences"]
    first, last = shard_bounds(meta["done"], n, ctx.rank, ctx.world_size)
    progress = folder / f"progress-{meta['done']}-{ctx.rank}-of-{ctx.world_size}.json"
    done = json.loads(progress.read_text())["done"] if progress.is_file() else first
    layout = {}
    for name, _, _ in arrays:  # byte offset of row 0 and bytes per row, from the .npy header
        m = np.load(folder / f"{name}.npy", mmap_mode="r")
        layout[name] = (m.offset, m[0].nbytes if len(m) else 0)
        del m
    with tqdm(total=last - first, initial=done - first, desc=f"{desc} [{ctx.rank}]", unit="seq",
              disable=not ctx.is_main) as bar:
        for start in range(done, last, batch_size):
            end = min(start + batch_size, last)
            for name, values in rows(start, end).items():
                offset, row_bytes = layout[name]
                with open(folder / f"{name}.npy", "r+b") as f:
                    f.seek(offset + start * row_bytes)
                    f.write(np.ascontiguousarray(values).tobytes())
                    f.flush()
                    os.fsync(f.fileno())
            tmp = progress.with_name(progress.name + ".partial")
            tmp.write_text(json.dumps({"done": end}))
            tmp.replace(progress)  # only after the rows are on disk
            bar.update(end - start)
    ctx.barrier()
    if ctx.is_main:
        write_meta(folder, {**meta, "done": n})
        for stale in folder.glob("progress-*.json"):
            stale.unlink()
    ctx.barrier()
