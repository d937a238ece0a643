"""The loss of hidden-state draft training (Make Every Draft Count), per sequence, on cached target features.

Anchor t is a context row: the draft has seen the target's final-normed states of positions
0..t and then its own j previous predictions; its j-th step (j = 0..k-1) predicts the state at
position p = t + j + 1. Two terms, weighted w_mse and w_kl (the paper's 0.7 and 0.3):

- MSE between that prediction and the target's state at p (mean over the hidden size), at every
  anchor (no output layer), or with deep_rows="anchors" at every anchor for j = 0 and at the KL
  anchors only for j >= 1;
- KL(p_target || q) at `anchors` sampled anchors, where q = softmax(clamp(lm_head(pred) + E(x_p)))
  is exactly what the drafter samples the children of the node holding token x_p from
  (drafters/hidden_tree.py: L_{d+1} + E(node token), at every depth including the root's). So
  token-info W_1, W_2 are trained through this term, consistently with their use.

A pair (t, j) is trained where token p + 1 is an assistant token (common/depths.py). A draft with its own
vocabulary (HiddenDraftConfig.draft_vocab_size) scores only those tokens: its KL is to the target's distribution
restricted to them (common/draft_vocab.py draft_vocab_kl, as EAGLE-3 trains), at pairs whose target top-1 it holds,
and its output layer costs draft_vocab_size / V of the full one (most of a step's time at depth 5).
Noise tokens: a `noise` fraction of the input rows is replaced by the state of another, random
position of the sequence, as if a wrong token had been read there; the targets stay clean. So the
draft learns not to lean on one input row, and to carry on from its own imperfect predictions.
Curriculum: the number of unrolled steps grows from 1 to the depth in equal stages over the first
`curriculum` fraction of training. Logit clamping bounds the draft logits entering the KL (instability guard).
Noise positions, anchors and the curriculum are pure functions of (seed, step, sequence).

deep_rows: "all" (the paper's recipe) unrolls every row of the sequence at every step, so a step
costs `k` passes of the layer over T rows; "anchors" unrolls steps j >= 1 only from the KL anchors
(A of T rows; each anchor's chain attends to the target rows and to its own earlier predictions
only, so the other rows are not needed): about 1 + (k - 1) * A / T passes; with 32 of 320 rows a
sequence's step took 2.2x less time at depth 5 (benchmarks/train/hidden_train_step.py), at the price of
fewer deep MSE pairs. The KL terms are the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from foretell.errors import ForetellError
from foretell.models.hidden_draft import HiddenDraft, unrolled_layout
from foretell.train.common.depths import anchor_seed, sample_anchors, valid_depths
from foretell.train.common.topk import topk_kl
from foretell.train.common.draft_vocab import columns_of, draft_vocab_kl


DEEP_ROWS = ("all", "anchors")


@dataclass(frozen=True)
class HiddenLossConfig:
    mse_weight: float = 0.7
    kl_weight: float = 0.3
    noise: float = 0.1  # share of input rows replaced by another position's state
    # The paper clamps to (-10, 10) for its target; SmolLM2's own top logits reach ~28, so a clamp
    # at 10 would flatten exactly the tokens that matter. 50 bounds runaway logits only.
    logit_clamp: float = 50.0
    anchors: int = 32  # KL anchors sampled per sequence and step (the MSE uses every anchor)
    curriculum: float = 0.5  # the stages 1..depth of unroll_steps span this share of the steps (0 = depth at once)
    deep_rows: str = "all"  # rows unrolled past step 1: "all" or "anchors" (the KL anchors; cheaper)

    def __post_init__(self):
        if min(self.mse_weight, self.kl_weight) < 0 or self.mse_weight + self.kl_weight <= 0:
            raise ForetellError(f"--mse-weight and --kl-weight must be >= 0 and not both 0, got "
                                f"{self.mse_weight} and {self.kl_weight}")
        if not 0.0 <= self.noise < 1.0:
            raise ForetellError(f"--noise must be in [0, 1), got {self.noise}")
        if not self.logit_clamp > 0:
            raise ForetellError(f"--logit-clamp must be > 0, got {self.logit_clamp}")
        if self.anchors < 1:
            raise ForetellError(f"--anchors must be >= 1, got {self.anchors}")
        if not 0.0 <= self.curriculum <= 1.0:
            raise ForetellError(f"--curriculum must be in [0, 1], got {self.curriculum}")
        if self.deep_rows not in DEEP_ROWS:
            raise ForetellError(f"--deep-rows takes {' or '.join(DEEP_ROWS)}, got {self.deep_rows!r}")


def unroll_steps(step: int, total_steps: int, depth: int, curriculum: float) -> int:
    """Steps unrolled at optimizer step `step` (0-based): 1, 2, .., depth in `depth` equal stages
    over the first curriculum * total steps (the last stage reaches on to the end)."""
    ramp = curriculum * total_steps
    if ramp <= 0:
        return depth
    return min(depth, 1 + int(step * depth // ramp))


def noise_rows(length: int, fraction: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, sources): round(fraction * length) distinct rows, each to be replaced by another row."""
    count = int(fraction * length + 0.5) if length > 1 else 0
    positions = torch.randperm(length, generator=generator)[:count]
    sources = (positions + torch.randint(1, max(length, 2), (count,), generator=generator)) % length
    return positions, sources


def with_noise(hidden: torch.Tensor, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """[T, H] rows with noise tokens: a copy where noise_rows' positions hold their sources' rows."""
    positions, sources = noise_rows(hidden.shape[0], fraction, generator)
    noisy = hidden.clone()
    noisy[positions] = hidden[sources]
    return noisy


class _BlockKeys:
    """Stands in for a KV cache in DecoderLayer: the keys and values of every block so far, grown by
    concatenation (no in-place writes, so autograd can backpropagate through all blocks)."""

    def __init__(self):
        self.k = self.v = None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def block_views(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `end` keys and values: DecoderLayer's one-row attention reads a real cache in whole blocks
        (KVCache.block_views), and a block of one row comes here (a sequence with a single anchor)."""
        return self.k[:, :, :end], self.v[:, :, :end]


def unroll(draft: HiddenDraft, hidden: torch.Tensor, steps: int) -> torch.Tensor:
    """HiddenDraft.forward_training's [B, T, steps, H], in `steps` layer passes instead of steps^2 / 2:
    block j's queries attend to the keys and values blocks 0..j left from their own pass, under
    the same layout (unrolled_layout), instead of recomputing the earlier blocks."""
    T = hidden.shape[1]
    positions, mask = unrolled_layout(T, steps, draft.device)
    keys, x, predicted = _BlockKeys(), hidden.to(draft.dtype), []
    for j in range(steps):
        rows = slice(j * T, (j + 1) * T)
        cos, sin = draft.rope(positions[rows])
        x = draft.norm(draft.layer(x, cos, sin, keys, 0, mask[rows, : (j + 1) * T][None, None]))
        predicted.append(x)
    return torch.stack(predicted, dim=2)


def anchored_layout(num_context: int, rows: torch.Tensor, num_blocks: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """unrolled_layout with blocks 1.. holding only `rows` (A ascending anchors): positions [T + (n-1) A] and
    mask [same, same]. Block j >= 1, row a, is the j-th own prediction from anchor a: it sees target rows
    0..a and row a of blocks 1..j."""
    T, A = num_context, len(rows)
    S = T + (num_blocks - 1) * A
    mask = torch.zeros(S, S, dtype=torch.bool, device=device)
    mask[:T, :T] = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    sees = torch.arange(T, device=device)[None, :] <= rows.to(device)[:, None]
    eye = torch.eye(A, dtype=torch.bool, device=device)
    positions = [torch.arange(T, device=device)]
    for j in range(1, num_blocks):
        block = slice(T + (j - 1) * A, T + j * A)
        mask[block, :T] = sees
        for i in range(1, j + 1):
            mask[block, T + (i - 1) * A : T + i * A] = eye
        positions.append(rows.to(device) + j)
    return torch.cat(positions), mask


def unroll_at(draft: HiddenDraft, hidden: torch.Tensor, steps: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """unroll with steps j >= 1 only from `rows`: (step 0 at every row [T, H], steps 1.. at rows [A, steps - 1, H]).
    hidden: [1, T, H]. Each anchor's predictions equal unroll's at that row (tests/test_train_hidden_state.py)."""
    T = hidden.shape[1]
    positions, mask = anchored_layout(T, rows, steps, draft.device)
    keys, deep = _BlockKeys(), []
    bounds = [(0, T)] + [(T + (j - 1) * len(rows), T + j * len(rows)) for j in range(1, steps)]
    x = hidden.to(draft.dtype)
    for j, (lo, hi) in enumerate(bounds):
        cos, sin = draft.rope(positions[lo:hi])
        x = draft.norm(draft.layer(x, cos, sin, keys, 0, mask[lo:hi, :hi][None, None]))
        if j == 0:
            first = x[0]
            x = x[:, rows.to(draft.device)]
        else:
            deep.append(x[0])
    deep = torch.stack(deep, dim=1) if deep else first.new_zeros(len(rows), 0, first.shape[-1])
    return first, deep


def mse_pairs(loss_mask: torch.Tensor, anchors: torch.Tensor, steps: int, cfg: HiddenLossConfig) -> torch.Tensor:
    """[T, k] bool: the (row, step) pairs whose hidden MSE is trained."""
    T = len(loss_mask)
    valid = valid_depths(loss_mask, torch.arange(T), steps)
    if cfg.deep_rows == "anchors" and steps > 1:
        unrolled = torch.zeros(T, steps, dtype=torch.bool)
        unrolled[:, 0] = True
        unrolled[anchors, 1:] = True
        valid &= unrolled
    return valid


def vocab_columns(draft: HiddenDraft) -> torch.Tensor | None:
    """[V] long: each target id's column in a draft with its own vocabulary, -1 outside it; None without one."""
    return columns_of(draft.output_ids, draft.config.vocab_size) if draft.config.draft_vocab_size else None


def kl_pairs(loss_mask: torch.Tensor, anchors: torch.Tensor, steps: int, top1: torch.Tensor,
             columns: torch.Tensor | None) -> torch.Tensor:
    """[A, steps] bool: the (anchor, step) pairs whose KL is trained; with a draft vocabulary (`columns`) only
    those whose target top-1 (top1 [T], the target's greedy token after each position) it can draft."""
    valid = valid_depths(loss_mask, anchors, steps)
    if columns is None:
        return valid
    at = (anchors[:, None] + torch.arange(1, steps + 1)).clamp(max=len(top1) - 1)
    return valid & (columns[top1[at]] >= 0)


def draft_logits(draft: HiddenDraft, predicted: torch.Tensor, node_tokens: torch.Tensor) -> torch.Tensor:
    """[..., H] predicted states and [...] node tokens -> [..., V] lm_head + E(node token), as the drafter samples."""
    info = draft.info(node_tokens.flatten()).view(*node_tokens.shape, -1)
    return draft.logits(predicted) + info


@dataclass
class SequenceTerms:
    mse: torch.Tensor  # [T, k] per-pair hidden MSE, every anchor
    mse_valid: torch.Tensor  # [T, k] bool
    kl: torch.Tensor  # [A, k] at the sampled anchors
    kl_valid: torch.Tensor  # [A, k] bool
    agree: torch.Tensor  # [A, k] bool: the draft's top-1 is the target's


def kl_anchors(loss_mask: torch.Tensor, cfg: HiddenLossConfig, seed: int, step: int, sequence: int) -> torch.Tensor:
    return sample_anchors(loss_mask, cfg.anchors, anchor_seed(seed, step, sequence))


def sequence_terms(draft: HiddenDraft, hidden: torch.Tensor, logp: torch.Tensor, ids: torch.Tensor,
                   tokens: torch.Tensor, loss_mask: torch.Tensor, steps: int, anchors: torch.Tensor,
                   cfg: HiddenLossConfig, generator: torch.Generator) -> SequenceTerms:
    """One sequence's terms: hidden [T, H] (the target's states), teacher top-k logp / ids [T, k'],
    tokens [T], loss_mask [T]; `steps` unrolled steps; KL at `anchors`."""
    T = hidden.shape[0]
    device = draft.device
    clean = hidden.to(device=device, dtype=torch.float32)
    noisy = with_noise(clean, cfg.noise, generator)[None]
    at = (torch.arange(T)[:, None] + torch.arange(1, steps + 1)).clamp(max=T - 1)  # position p of each (t, j)
    at_a = at[anchors]
    if cfg.deep_rows == "all":
        predicted = unroll(draft, noisy, steps)[0]  # [T, k, H]
        mse = (predicted.float() - clean[at.to(device)]).pow(2).mean(-1)
        at_anchors = predicted[anchors.to(device)]
    else:
        first, deep = unroll_at(draft, noisy, steps, anchors)
        at_anchors = torch.cat([first[anchors.to(device)][:, None], deep], dim=1)  # [A, k, H]
        mse = torch.zeros(T, steps, device=device)
        mse[:, 0] = (first.float() - clean[at[:, 0].to(device)]).pow(2).mean(-1)
        if steps > 1:
            deep_mse = (deep.float() - clean[at_a[:, 1:].to(device)]).pow(2).mean(-1)
            mse = mse.index_put((anchors.to(device)[:, None], torch.arange(1, steps, device=device)[None]), deep_mse)
    logits = draft_logits(draft, at_anchors, tokens[at_a].to(device))
    logits = logits.clamp(-cfg.logit_clamp, cfg.logit_clamp)
    columns = vocab_columns(draft)
    if columns is None:
        kl = topk_kl(logits, logp[at_a].to(device), ids[at_a].to(device))
        drafted = logits.detach().argmax(-1).cpu()
    else:
        kl = draft_vocab_kl(logits, logp[at_a].to(device), columns[ids[at_a]].to(device))
        drafted = draft.output_ids.cpu()[logits.detach().argmax(-1).cpu()]
    agree = drafted == ids[at_a][..., 0]
    return SequenceTerms(mse, mse_pairs(loss_mask, anchors, steps, cfg), kl,
                         kl_pairs(loss_mask, anchors, steps, ids[:, 0].long(), columns), agree)
