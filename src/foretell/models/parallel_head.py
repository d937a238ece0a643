"""A parallel draft head (JetSpec, "causal parallel tree drafting"): one light transformer forward drafts D tokens.

Input row i, for each committed position i: a linear fusion of the target's hidden states at i
(a few of its layers, e.g. low / middle / high) and the target's own embedding of token i + 1,
so row i predicts token i + 2. After the last context row come D - 1 placeholder rows (one
learned mask embedding) at the following positions. Attention is causal throughout: a
placeholder sees the whole context and the placeholders before it. One forward thus yields D
distributions: depth 1 from the last context row, depths 2..D from the placeholders. Drafted
tokens are never fed back, so each depth's distribution is the same for every tree parent.

The head keeps its own KV cache over the context rows only: a forward writes the placeholders'
slots too, but the caller commits just the context rows, so the next forward overwrites them.
The target's embedding and output layer are shared (frozen, not copied, not saved).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from foretell.errors import ForetellError
from foretell.hot_vocab import HotVocab, checked_vocab_ids
from foretell.kv_cache import KVCache
from foretell.models.config import ModelConfig
from foretell.models.drafter_module import DrafterModule, TargetSizes, check_target_sizes
from foretell.models.module_folder import (
    WEIGHTS_FILE, PARALLEL_HEAD_FORMAT, load_weights, read_config, save_module, saved_folder,
)
from foretell.models.transformer import DecoderLayer, RMSNorm, RotaryTables, Transformer, softcap

if TYPE_CHECKING:
    from foretell.runtime.lean_drafters import LayersPass

FOLDER_FORMAT = PARALLEL_HEAD_FORMAT
FORMAT, FORMAT_VERSION, CONFIG_FILE = FOLDER_FORMAT.name, FOLDER_FORMAT.version, FOLDER_FORMAT.config_file


def default_fuse_layers(target_num_layers: int) -> tuple[int, ...]:
    """Low, middle and high target layers (EAGLE-3's choice), deduplicated for shallow targets."""
    L = target_num_layers
    return tuple(sorted({max(1, min(2, L)), max(1, L // 2), max(1, L - 2)}))


@dataclass(frozen=True)
class ParallelHeadConfig(TargetSizes):  # the head reads the target's embeddings and feeds its output layer
    target_num_layers: int  # checked at load: fuse_layers index this target's layers
    fuse_layers: tuple[int, ...]  # target hidden layers fused into each input row (0 = embeddings, L = final norm)
    num_layers: int = 1
    depth: int = 4  # D: tokens drafted per forward (1 context row + D - 1 placeholders)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    # 0: the head scores the whole vocabulary (or a hot vocabulary chosen at load). N: it was trained on its own
    # N-token draft vocabulary (the buffer draft_vocab_ids), scores only those and always drafts among them.
    draft_vocab_size: int = 0

    def __post_init__(self):
        object.__setattr__(self, "fuse_layers", tuple(int(x) for x in self.fuse_layers))
        if self.num_layers < 1 or self.depth < 1:
            raise ForetellError(f"a parallel head needs num_layers >= 1 and depth >= 1, got {self.num_layers} and {self.depth}")
        if not 0 <= self.draft_vocab_size <= self.vocab_size:
            raise ForetellError(f"draft_vocab_size must be in 0..{self.vocab_size} (0 = the whole vocabulary), "
                                f"got {self.draft_vocab_size}")
        layers = self.fuse_layers
        if not layers or len(set(layers)) != len(layers) or min(layers) < 0 or max(layers) > self.target_num_layers:
            raise ForetellError(
                f"fuse_layers must be distinct target layers in 0..{self.target_num_layers}, got {list(layers)}"
            )

    @classmethod
    def for_target(
        cls, target: ModelConfig, num_layers: int = 1, depth: int = 4, fuse_layers: Sequence[int] | None = None,
        draft_vocab_size: int = 0,
    ) -> "ParallelHeadConfig":
        """Sizes taken from the target (hidden size, heads, MLP width, RoPE)."""
        return cls(
            hidden_size=target.hidden_size,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=target.head_dim,
            intermediate_size=target.intermediate_size,
            vocab_size=target.vocab_size,
            target_num_layers=target.num_hidden_layers,
            fuse_layers=tuple(fuse_layers) if fuse_layers is not None else default_fuse_layers(target.num_hidden_layers),
            num_layers=num_layers,
            depth=depth,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            attention_bias=target.attention_bias,
            draft_vocab_size=draft_vocab_size,
        )

    def layer_config(self, target: ModelConfig) -> ModelConfig:
        """The ModelConfig DecoderLayer is built from: this head's sizes, with the target family's layer
        features (norm kind, activation, q/k norms, attention scale and soft-cap)."""
        return target.drafter_layers(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, attention_bias=self.attention_bias,
        )

    def check_target(self, target: ModelConfig) -> None:
        check_target_sizes(self, target, "parallel head", "a head")


@dataclass(frozen=True)
class TargetParts:
    """The target's modules the head shares. A plain dataclass, so nn.Module neither registers
    nor saves them: they stay the target's (frozen) weights."""

    embed_tokens: nn.Embedding
    lm_head: nn.Module  # the full output layer, or the hot-vocabulary rows of it
    hot: HotVocab | None = None
    final_softcap: float | None = None  # the target's logit soft-cap (Gemma 2), applied as the target does


class ParallelHead(DrafterModule):
    placed_by = "norm"  # its fuse may be int8 (quantize)

    def __init__(self, config: ParallelHeadConfig, target: Transformer, hot: HotVocab | None = None):
        super().__init__()
        config.check_target(target.config)
        self.config = config
        if config.draft_vocab_size:  # its own vocabulary (set_draft_vocab); a load-time hot vocabulary narrows it
            self.register_buffer("draft_vocab_ids", torch.arange(config.draft_vocab_size))
            hot = None
        lm_head = hot.head(target.lm_head) if hot is not None else target.lm_head
        self.shared = TargetParts(target.embed_tokens, lm_head, hot, target.config.final_softcap)
        H = config.hidden_size
        self.fuse = nn.Linear((len(config.fuse_layers) + 1) * H, H, bias=False)
        self.mask_embedding = nn.Parameter(torch.zeros(H))
        layer_config = config.layer_config(target.config)
        self.layers = nn.ModuleList(DecoderLayer(layer_config) for _ in range(config.num_layers))
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.rotary = RotaryTables(config.head_dim, config.rope_theta, None, 0)
        self.lean = None  # runtime/drafter_modules.use_lean_step: its layers in one native call, fuse and logits
        # in the column kernel
        self.to(dtype=target.dtype, device=target.device)

    def set_draft_vocab(self, ids: torch.Tensor, target: Transformer, hot: HotVocab | None = None) -> None:
        """Make `ids` (ascending, distinct target ids) the head's own vocabulary: its output layer becomes those rows
        of the target's (frozen, not saved). `hot`, a load-time hot vocabulary, narrows the drafting to the ids in
        both: the head's logits off its own vocabulary were never trained."""
        ids = checked_vocab_ids(ids, self.config.draft_vocab_size, self.config.vocab_size, "a parallel head")
        with torch.no_grad():
            self.draft_vocab_ids.copy_(ids)
        drafted = ids if hot is None else ids[torch.isin(ids, hot.ids.cpu())]
        vocab = HotVocab(drafted, self.config.vocab_size)
        with torch.random.fork_rng(devices=[]):  # cutting rows builds an nn.Linear, whose init draws from the RNG
            self.shared = replace(self.shared, lm_head=vocab.head(target.lm_head), hot=vocab)
        self.lean = None  # packed over the old output layer

    @property
    def cache_layers(self) -> int:
        return self.config.num_layers

    def features(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """[..., len(fuse_layers) * H]: the fused layers' hidden states side by side."""
        missing = [layer for layer in self.config.fuse_layers if layer not in hidden]
        if missing:
            raise ForetellError(f"the parallel head needs target hidden layers {missing}, which were not provided")
        return torch.cat([hidden[layer] for layer in self.config.fuse_layers], dim=-1)

    def context_inputs(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Input rows [..., H] from target features at i and the (frozen) embedding of token i + 1."""
        embedded = self.shared.embed_tokens(next_tokens).detach()
        rows = torch.cat([features.to(self.dtype), embedded], dim=-1)
        fused = self.lean.input(rows) if self.native() and rows.dim() == 2 else None
        return self.fuse(rows) if fused is None else fused

    def _run_layers(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, mask) -> torch.Tensor:
        cos, sin = self.rope(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, mask)
        return self.norm(x)

    def logits(self, x: torch.Tensor, full_vocab: bool = True) -> torch.Tensor:
        """[..., H] normed rows -> [..., V] float32 logits over the full vocabulary (-inf off a hot set);
        with full_vocab=False over the head's own vocabulary (`vocab_ids`), which skips the expansion."""
        out = self.lean.logits(x) if self.native() and x.dim() == 2 else None
        if out is None:
            out = self.shared.lm_head(x)
        if self.shared.final_softcap is not None:
            out = softcap(out, self.shared.final_softcap)
        out = out.float()
        return self.shared.hot.expand(out) if self.shared.hot is not None and full_vocab else out

    @property
    def vocab_ids(self) -> torch.Tensor | None:
        """Full-vocabulary id of each column of logits(full_vocab=False); None when they are the full vocabulary."""
        return self.shared.hot.ids if self.shared.hot is not None else None

    def forward(
        self, features: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache, num_placeholders: int,
        full_vocab: bool = True,
    ) -> torch.Tensor:
        """Feed n >= 1 new context rows after the cache's prefix, then `num_placeholders` placeholders.

        features: [n, len(fuse_layers) * H], the target rows of positions cache.length ..
        cache.length + n - 1; next_tokens: [n] long, the token after each of them. Writes n +
        num_placeholders slots; the caller commits the n context rows (cache.commit_prefix(n)).
        Returns [1 + num_placeholders, V] float32 logits: row d - 1 scores depth d, the token
        d positions after the last committed token (full_vocab=False: columns are `vocab_ids`).
        """
        x = self.pass_rows(features, next_tokens, num_placeholders)
        native = self.native_pass(x, cache)
        if native is not None:
            return self.logits(native.run()[features.shape[0] - 1 :], full_vocab)
        return self.forward_rows(x, features.shape[0], cache, full_vocab)

    def pass_rows(self, features: torch.Tensor, next_tokens: torch.Tensor, num_placeholders: int) -> torch.Tensor:
        """forward()'s input rows [n + num_placeholders, H]: the context rows, then the placeholders."""
        if features.shape[0] < 1:
            raise ValueError("the parallel head needs at least one new context row per forward")
        return torch.cat([self.context_inputs(features, next_tokens), self.mask_embedding.expand(num_placeholders, -1)])

    def native_pass(self, x: torch.Tensor, cache: KVCache) -> LayersPass | None:
        """The layers' pass over rows x after the cache's length where it runs in the lean step (run alone, or
        packed with other requests' passes: runtime/packed.run_draft_passes), else None; checks the cache's room."""
        cache.check_room(x.shape[0])
        if not self.native(x.shape[0]):
            return None
        return self.lean.layers_pass(x, torch.arange(cache.length, cache.length + x.shape[0], device=self.device), cache)

    def forward_rows(self, x: torch.Tensor, n: int, cache: KVCache, full_vocab: bool) -> torch.Tensor:
        """forward() over its input rows x in PyTorch (the lean step's is native_pass)."""
        T, start = x.shape[0], cache.length
        cache.check_room(T)
        positions = torch.arange(start, start + T, device=self.device)
        mask = None  # one row sees the whole cache
        if T > 1:
            causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
            mask = torch.cat([torch.ones(T, start, dtype=torch.bool, device=self.device), causal], dim=1)[None, None]
        x = self._run_layers(x[None], positions, cache, mask)[0]
        return self.logits(x[n - 1 :], full_vocab)

    def forward_training(
        self, features: torch.Tensor, next_tokens: torch.Tensor, anchors: Sequence[int], full_vocab: bool = True
    ) -> torch.Tensor:
        """All depths for many anchors of whole sequences in one cache-free forward (for training).

        features: [B, T, len(fuse_layers) * H] target rows of positions 0..T-1; next_tokens:
        [B, T], the token after each (ids[1:T + 1]). Returns [B, A, D, V] logits: [b, k, d - 1]
        is the head's distribution at depth d from anchor a = anchors[k], i.e. for token
        ids[a + 1 + d], exactly what inference gives after committing ids[:a + 2] (full_vocab=False: the last
        axis is `vocab_ids`).
        """
        D = self.config.depth
        positions, mask, rows = training_layout(features.shape[1], anchors, D, self.device)
        x = self.context_inputs(features, next_tokens)
        B = x.shape[0]
        x = torch.cat([x, self.mask_embedding.expand(B, len(anchors) * (D - 1), -1)], dim=1)
        x = self._run_layers(x, positions, None, mask[None, None])
        return self.logits(x[:, rows.reshape(-1)], full_vocab).view(B, len(anchors), D, -1)


def training_layout(
    num_context: int, anchors: Sequence[int], depth: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions [S], attention mask [S, S] bool and logit rows [A, D] for forward_training.

    Rows 0..T-1 are the context (causal among themselves). Then, per anchor a (in order), a block
    of D - 1 placeholders at positions a + 1 .. a + D - 1: placeholder j of the block sees the
    context rows 0..a and placeholders 1..j of its own block, as at inference. rows[k] lists the
    rows scoring depths 1..D for anchor k: the context row a, then its block.
    """
    T, P = num_context, depth - 1
    if any(not 0 <= a < T for a in anchors):
        raise ValueError(f"anchors must index context rows 0..{T - 1}, got {list(anchors)}")
    S = T + len(anchors) * P
    mask = torch.zeros(S, S, dtype=torch.bool, device=device)
    mask[:T, :T] = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    positions = [*range(T)]
    rows = []
    for k, a in enumerate(anchors):
        first = T + k * P
        mask[first : first + P, : a + 1] = True
        mask[first : first + P, first : first + P] = torch.ones(P, P, dtype=torch.bool, device=device).tril()
        positions.extend(range(a + 1, a + 1 + P))
        rows.append([a, *range(first, first + P)])
    return torch.tensor(positions, device=device), mask, torch.tensor(rows, device=device).view(len(anchors), depth)


def new_parallel_head(
    target: Transformer, config: ParallelHeadConfig | None = None, seed: int = 0, hot: HotVocab | None = None,
    draft_vocab: torch.Tensor | None = None,
) -> ParallelHead:
    """An untrained (randomly initialised) head for `target`: for tests and as training's start. draft_vocab: with
    config.draft_vocab_size, the head's own vocabulary (ascending target ids; default the first draft_vocab_size)."""
    config = config or ParallelHeadConfig.for_target(target.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = ParallelHead(config, target, hot)
        if config.draft_vocab_size:
            head.set_draft_vocab(draft_vocab if draft_vocab is not None else torch.arange(config.draft_vocab_size),
                                 target, hot)
        with torch.no_grad():
            head.mask_embedding.normal_(0.0, float(target.embed_tokens.weight.float().std()))
    return head


def save_parallel_head(head: ParallelHead, folder: str | Path) -> Path:
    """Write parallel_head.json (format and config) and model.safetensors (the head's own weights)."""
    return save_module(head, head.config, folder, FOLDER_FORMAT)


def read_head_config(folder: Path) -> ParallelHeadConfig:
    return read_config(saved_folder(folder, FOLDER_FORMAT), ParallelHeadConfig, FOLDER_FORMAT)


def load_parallel_head(folder: str | Path, target: Transformer, hot: HotVocab | None = None) -> ParallelHead:
    """Load a head saved by save_parallel_head onto `target` (its dtype and device). A head trained on its own
    vocabulary drafts among it, narrowed to `hot` (a load-time hot vocabulary) when one is given. `folder` may be
    the --out folder of the training run that saved it."""
    folder = saved_folder(folder, FOLDER_FORMAT)
    config = read_head_config(folder)
    config.check_target(target.config)
    head = ParallelHead(config, target, hot)
    load_weights(head, folder, FOLDER_FORMAT)
    if config.draft_vocab_size:
        try:
            head.set_draft_vocab(head.draft_vocab_ids.clone(), target, hot)
        except ForetellError as e:
            raise ForetellError(f"{folder / WEIGHTS_FILE}: {e}; the file is damaged") from None
    return head.to(dtype=target.dtype, device=target.device)
