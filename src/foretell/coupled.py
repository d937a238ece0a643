"""Coupled sampling: the token at each output position is decided by noise keyed on (seed, position) alone.

The target's token at output position t is argmax(log p_t + G_t) (the Gumbel-max trick), where p_t is the
target's processed distribution (temperature, top-k, top-p; cut tokens at -inf) and G_t[v] is Gumbel(0, 1) noise
from a counter-based hash of (seed, t, v). Gumbel-max draws exactly from p_t, and G_t is fresh at every position,
so the output is distributed exactly as the target's. The token is a function of the seed and the tokens before it,
never of the drafts, so:

- verification is like greedy decoding's: a draft node is accepted iff its token equals the target's coupled token
  at its position (a tree: follow the child that does), and the target's coupled token after the accepted path
  comes next. Speculative decoding then returns plain decoding's very tokens, whatever the drafts, tree, budget,
  batch or timing;
- a drafter may rank its candidates with the same noise, log q + G_t (`draft_ranking`): when q is close to p its
  first choice is the target's token far more often than q's most likely token is.

The hash gives the noise of any token at any position, identically on any device and in any batch (numpy's
wrapping uint64 arithmetic on the CPU), so only the tokens that can still win are computed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from foretell.sampling import processed_logits, ranking_probs
from foretell.tree import children_lists
from foretell.types import Proposal, SamplingParams, Verification

_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_UNIT = 2.0 ** -52


def _gumbel(u: np.ndarray) -> np.ndarray:
    return -np.log(-np.log(u))


# Uniforms are (k + 0.5) / 2^52 for 52-bit k: in (0, 1), never 0 or 1, so the noise is finite and at most this.
GUMBEL_MAX = float(_gumbel(np.float64((2**52 - 0.5) * _UNIT)))
CANDIDATES = 64  # tokens whose noise is tried first; the rest are computed only if they can still win


def position_key(seed: int, position: int) -> np.uint64:
    """A 64-bit key for (seed, output position), mixed by a cryptographic hash so nearby seeds share nothing."""
    return np.uint64(int.from_bytes(hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest(), "little"))


def hashed_noise(key: np.uint64, ids: np.ndarray) -> np.ndarray:
    """float64 Gumbel(0, 1) noise of token `ids` under `key`: splitmix64 of (key, id), a uniform in (0, 1) from its
    top 52 bits, then -log(-log u)."""
    z = (ids.astype(np.uint64) + np.uint64(1)) * _GOLDEN + key
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return _gumbel(((z >> np.uint64(12)).astype(np.float64) + 0.5) * _UNIT)


class GumbelNoise:
    """One request's noise: Gumbel(0, 1) for every (output position, token id), a pure function of the seed.

    Positions count output tokens: sequence index `origin` (the prompt's length) is output position 0. Drafters read
    a position's noise many times (every node of a level, every pass until it is decided), so whole rows over the
    target's `vocab_size` tokens are kept for the last ROWS positions asked for them; elsewhere only the tokens
    asked for are computed. Either way the values are the hash's."""

    ROWS = 32

    def __init__(self, seed: int, origin: int, vocab_size: int):
        self.seed, self.origin, self.vocab_size = seed, origin, vocab_size
        self._rows: dict[int, torch.Tensor] = {}
        self._draft_rows: dict[tuple, tuple[torch.Tensor | None, torch.Tensor]] = {}  # see drafting_row

    def row(self, index: int) -> torch.Tensor:
        """[vocab_size] float64 noise at sequence index `index` (CPU), kept for the next reads."""
        row = self._rows.get(index)
        if row is None:
            row = self._rows[index] = torch.from_numpy(hashed_noise(self._key(index), np.arange(self.vocab_size)))
            if len(self._rows) > self.ROWS:
                del self._rows[min(self._rows)]  # positions only move forward
        return row

    def kept(self, index: int) -> torch.Tensor | None:
        return self._rows.get(index)

    def drafting_row(self, index: int, ids: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """float32 noise at `index` of the columns `ids` (a drafter's own vocabulary; None: every token), on
        `device`, kept: a drafter reads it for every node of a level, in every pass until the position is decided."""
        key = (index, str(device))
        entry = self._draft_rows.get(key)
        if entry is None or entry[0] is not ids:
            g = self.row(index)
            entry = self._draft_rows[key] = (ids, (g if ids is None else g[ids.cpu()]).to(device, torch.float32))
            if len(self._draft_rows) > self.ROWS:
                del self._draft_rows[min(self._draft_rows)]
        return entry[1]

    def values(self, index: int | Sequence[int], ids: torch.Tensor, keep_row: bool = False) -> torch.Tensor:
        """float64 noise of token `ids` at sequence index `index`, on ids' device. With one index per row of a
        2-D `ids`, row r's noise is at index[r]. keep_row: compute and keep the whole row (a drafter's reads)."""
        flat = ids.detach().cpu()
        if isinstance(index, int):
            out = self._at(index, flat, keep_row)
        else:
            out = torch.stack([self._at(i, row, keep_row) for i, row in zip(index, flat)])
        return out.to(ids.device)

    def _at(self, index: int, ids: torch.Tensor, keep_row: bool) -> torch.Tensor:
        row = self.row(index) if keep_row else self.kept(index)
        if row is not None and (ids.numel() == 0 or int(ids.max()) < len(row)):
            return row[ids]
        return torch.from_numpy(hashed_noise(self._key(index), ids.numpy()))

    def _key(self, index: int) -> np.uint64:
        return position_key(self.seed, index - self.origin)


def coupled_token(scores: torch.Tensor, noise: GumbelNoise, index: int) -> int:
    """argmax(scores + G) over a [V] row of processed logits (-inf: cut), the noise at sequence index `index`; ties
    go to the lowest id (as torch.argmax).

    Exact, computing little noise: over a whole row where one is kept (or where most tokens could win), else only
    over the tokens that can win: the best of the CANDIDATES highest scores bounds the winner's total from below,
    and a token whose score is more than GUMBEL_MAX below that bound cannot reach it."""
    kept = noise.kept(index)
    if kept is not None and len(kept) == scores.shape[-1]:
        return int((scores.double() + kept.to(scores.device)).argmax())
    top = torch.topk(scores, min(CANDIDATES, scores.shape[-1])).indices
    bound = float((scores[top].double() + noise.values(index, top)).max())
    # (a margin far above float64 rounding; ids ascend, so argmax keeps the lowest of tied ids)
    ids = (scores.double() >= bound - GUMBEL_MAX - 1e-6).nonzero().flatten()
    if ids.numel() > scores.shape[-1] // 8 and noise.vocab_size == scores.shape[-1]:
        return int((scores.double() + noise.row(index).to(scores.device)).argmax())
    return int(ids[(scores[ids].double() + noise.values(index, ids)).argmax()])


@dataclass(frozen=True)
class Coupling:
    """The noise a verification pass decides with: its row 0 decides sequence index `index`, and the row after a
    path of d draft tokens index + d."""

    noise: GumbelNoise
    index: int

    def after(self, depth: int) -> Coupling:
        """The coupling of a pass whose row 0 sits `depth` positions later (lossy mode's waived prefix)."""
        return Coupling(self.noise, self.index + depth)

    def token(self, logits_row: torch.Tensor, params: SamplingParams, depth: int) -> int:
        return coupled_token(processed_logits(logits_row, params), self.noise, self.index + depth)


def verify_coupled(target_logits: torch.Tensor, proposal: Proposal, params: SamplingParams,
                   coupling: Coupling) -> Verification:
    """Greedy-like verification under the coupled rule; target_logits rows as for `verify` (row 0: the root, row
    i + 1: after node i). Only the rows on the accepted path are processed."""
    tokens = proposal.tokens.tolist()
    if proposal.is_chain:
        for i, x in enumerate(tokens):
            want = coupling.token(target_logits[i], params, i)
            if x != want:
                return Verification(i, want)
        return Verification(len(tokens), coupling.token(target_logits[len(tokens)], params, len(tokens)))
    children = children_lists(proposal.parents)
    path: list[int] = []
    node = -1
    while True:
        want = coupling.token(target_logits[node + 1], params, len(path))
        match = next((c for c in children[node + 1] if tokens[c] == want), None)
        if match is None:
            return Verification(len(path), want, path)
        path.append(match)
        node = match


def draft_ranking(logits: torch.Tensor, params: SamplingParams, noise: GumbelNoise | None,
                  index: int | Sequence[int], ids: torch.Tensor | None = None) -> torch.Tensor:
    """What a drafter ranks its candidates by, [..., V] like its logits: `ranking_probs`, or under the coupled rule
    softmax(log q + G) with the noise at sequence index `index` (one per row of 2-D logits; zero where q is cut).
    Under the rule the target's token is argmax(log p + G): with p near q this ranks it first, and softmax(log q + G)
    estimates each candidate's chance of being it. ids: the target's id of each column when the drafter has a
    vocabulary of its own. float32: a ranking needs no more."""
    if noise is None or params.greedy:
        return ranking_probs(logits, params)
    scores = processed_logits(logits, params)
    if isinstance(index, int):
        g = noise.drafting_row(index, ids, scores.device)
    elif scores.dim() == 2 and len(index) == scores.shape[0]:
        g = torch.stack([noise.drafting_row(i, ids, scores.device) for i in index])
    else:
        raise ValueError(f"one index per row of the logits ({tuple(scores.shape)}), got {list(index)}")
    return (scores + g).softmax(-1)
