"""A preallocated key/value cache written by slot.

The cache holds `length` committed slots. A forward over T new tokens writes slots
[length, length + T) and attends to [0, length + T); it does not move `length`. The engine
then commits what verification accepted:

- a chain keeps a prefix of the new slots: `commit_prefix(n)` just moves the length, and the
  rejected slots are overwritten by the next forward (no copy at all);
- a tree keeps one root-to-leaf path: `commit_slots(idx)` copies those slots down to be
  contiguous after the committed prefix, then moves the length.
"""

from __future__ import annotations

import torch

# Slots are allocated in blocks of this many, so that one-token attention can read a whole number of blocks
# (kv_cache.KVCache.block_views): the runtime keeps kernels per matrix shape, and one per key length grew a
# server's memory by hundreds of MiB (docs/serving.md).
SLOT_BLOCK = 64


def whole_blocks(slots: int) -> int:
    return -(-slots // SLOT_BLOCK) * SLOT_BLOCK


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        batch: int = 1,  # rows decoded side by side (batched generation); the engine uses 1
    ):
        shape = (num_layers, batch, num_kv_heads, whole_blocks(capacity), head_dim)  # [L, B, H_kv, S, D]
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0

    def check_room(self, num_new: int) -> None:
        if self.length + num_new > self.capacity:
            raise ValueError(
                f"KV cache overflow: {self.length} committed + {num_new} new > capacity {self.capacity}"
            )

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v ([B, H_kv, T, D]) after the committed prefix; return the views to attend to."""
        end = self.length + k.shape[2]
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def block_views(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of slots [0, end) rounded up to whole blocks; slots past `end` hold zeros or stale
        finite values, so a caller must give them zero weight."""
        end = whole_blocks(end)
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def commit_prefix(self, num_new: int) -> None:
        """Keep the first `num_new` slots written by the last forward."""
        self.length += num_new

    def commit_slots(self, new_slot_indices: torch.Tensor) -> None:
        """Keep the given slots (indices relative to the last forward's first new slot), in order."""
        n = int(new_slot_indices.numel())
        if n == 0:
            return
        src = new_slot_indices.to(self.k.device) + self.length
        if torch.equal(src, torch.arange(self.length, self.length + n, device=src.device)):
            self.length += n
            return
        dst = slice(self.length, self.length + n)
        self.k[:, :, :, dst] = self.k.index_select(3, src)
        self.v[:, :, :, dst] = self.v.index_select(3, src)
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget everything after `length` committed slots (e.g. a drafter re-syncing)."""
        if length > self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
