"""Prompt prefixes kept for the requests that follow (a server's prefix cache).

Chat requests repeat themselves: every turn of a conversation resends the whole history, and an application's
requests share its system prompt. After a request has read its prompt, and again when it finishes (prompt and
answer), its KV rows (and the target's hook rows its drafter read) are kept here, up to a byte budget, least
recently used first out. A later request whose prompt starts with the same tokens copies those rows into its own
cache and reads only the rest: a conversation's next turn reads only its new messages. Reuse is exact: a row's
keys and values depend only on the tokens up to it, and on the lean step each row gets the same arithmetic whatever
else shares its pass (runtime/packed.py), so a reused row is the row the request would have computed.

vLLM's automatic prefix caching and llama.cpp's `cache_prompt` do the same (with shared blocks, and per slot).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from foretell.errors import ForetellError
from foretell.kv_cache import KVCache

MIN_REUSED = 16  # shorter common prefixes are read again: copying is not worth its bookkeeping


@dataclass
class Prefix:
    """The rows of one prompt prefix: keys and values [L, 1, H_kv, n, D], and the hook layers' rows [n, H]."""

    tokens: tuple[int, ...]
    k: torch.Tensor
    v: torch.Tensor
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, *self.hidden.values()))


@dataclass
class PrefixStats:
    """Requests that looked, those that reused rows, and the prompt tokens they did not read again."""

    queries: int = 0
    hits: int = 0
    reused_tokens: int = 0


class PrefixCache:
    def __init__(self, max_bytes: int, min_tokens: int = MIN_REUSED):
        """max_bytes: what its entries may hold together; min_tokens: the shortest prefix kept or reused."""
        if max_bytes < 0 or min_tokens < 1:
            raise ForetellError(f"a prefix cache needs max_bytes >= 0 and min_tokens >= 1, got {max_bytes} and {min_tokens}")
        self.max_bytes, self.min_tokens = max_bytes, min_tokens
        self.entries: OrderedDict[tuple[int, ...], Prefix] = OrderedDict()  # least recently used first
        self.nbytes = 0
        self.stats = PrefixStats()
        self.kept = 0  # entries stored so far: a request that looked before the last one may look again

    @classmethod
    def of_megabytes(cls, megabytes: int) -> PrefixCache | None:
        """A cache of `megabytes` MiB; None for 0 (the flag's "off")."""
        return cls(megabytes << 20) if megabytes else None

    def reuse(self, ids: list[int], cache: KVCache, layers: tuple[int, ...]
              ) -> tuple[int, dict[int, torch.Tensor]] | None:
        """Copy the longest kept prefix of `ids[:-1]` (the prompt's last token is read by the first decoding pass)
        into `cache`, past the rows it holds already (a prefix of `ids` taken from here before); the cache's new
        length and the hook rows of the copied rows (for the drafter), or None when no prefix of at least
        min_tokens reaches past them. layers: the hook layers the request's drafter reads (an entry kept without
        them cannot serve it)."""
        self.stats.queries += 1
        best, length, start = None, 0, cache.length
        for entry in self.entries.values():
            if not set(layers) <= entry.hidden.keys():
                continue
            n = common_length(entry.tokens, ids, len(ids) - 1)
            if n > length:
                best, length = entry, n
        if best is None or length < self.min_tokens or length <= start:
            return None
        if best.k.dtype != cache.k.dtype or best.k.shape[:3] != cache.k.shape[:3] or best.k.shape[4] != cache.k.shape[4]:
            return None  # another model's rows (a prefix cache serves one target: not expected)
        cache.k[:, :, :, start:length] = best.k[:, :, :, start:length]
        cache.v[:, :, :, start:length] = best.v[:, :, :, start:length]
        cache.commit_prefix(length - start)
        self.entries.move_to_end(best.tokens)
        self.stats.hits += 1
        self.stats.reused_tokens += length - start
        return length, {i: best.hidden[i][start:length] for i in layers}

    def holds(self, tokens: int, cache: KVCache) -> bool:
        """Whether an entry of `tokens` of `cache`'s rows fits at all (keep refuses one larger than the whole
        cache)."""
        return 2 * tokens * cache.k[:, :, :, :1].numel() * cache.k.element_size() <= self.max_bytes

    def keep(self, ids: list[int], cache: KVCache, hidden: dict[int, torch.Tensor]) -> None:
        """Keep the cache's `len(ids)` committed rows as the prefix `ids`, with the hook rows `hidden` ([len(ids),
        H] a layer). An entry the new one extends is dropped (the new one serves its requests too); one that
        already covers `ids` is only marked used."""
        tokens = tuple(ids)
        n = len(tokens)
        if n < self.min_tokens or cache.length < n:
            return
        covering = next((key for key, kept in self.entries.items()
                         if key[:n] == tokens and hidden.keys() <= kept.hidden.keys()), None)
        if covering is not None:
            self.entries.move_to_end(covering)
            return
        rows = [cache.k[:, :, :, :n], cache.v[:, :, :, :n], *(h[:n] for h in hidden.values())]
        if sum(t.numel() * t.element_size() for t in rows) > self.max_bytes:
            return  # larger than the whole cache
        entry = Prefix(tokens, rows[0].clone(), rows[1].clone(), {i: h[:n].clone() for i, h in hidden.items()})
        for key in [key for key, kept in self.entries.items()
                    if tokens[:len(key)] == key and kept.hidden.keys() <= hidden.keys()]:
            self._drop(key)
        while self.entries and self.nbytes + entry.nbytes > self.max_bytes:
            self._drop(next(iter(self.entries)))
        self.entries[tokens] = entry
        self.nbytes += entry.nbytes
        self.kept += 1

    def _drop(self, key: tuple[int, ...]) -> None:
        self.nbytes -= self.entries.pop(key).nbytes


def common_length(kept: tuple[int, ...], ids: list[int], limit: int) -> int:
    """How many leading tokens `kept` and `ids` share, at most `limit`."""
    n = min(len(kept), limit)
    if tuple(ids[:n]) == kept[:n]:
        return n
    low, high = 0, n  # kept[:low] == ids[:low] and kept[:high] != ids[:high]: halve the difference
    while high - low > 1:
        mid = (low + high) // 2
        if tuple(ids[:mid]) == kept[:mid]:
            low = mid
        else:
            high = mid
    return low
