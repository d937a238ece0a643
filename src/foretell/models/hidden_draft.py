"""The hidden-state draft model ("Make Every Draft Count", arXiv 2602.21224):
one decoder layer autoregressing on hidden states.

Its inputs and outputs live in one space: the target's *final-normed* last-layer hidden states
(hook layer L = num_layers, the rows the target's output layer reads). We chose the normed
states over the pre-norm residual stream because (a) the engine's hook already hands them
over, (b) their scale is fixed by the norm, so feeding the draft's own predictions back is
well conditioned, and (c) logits are then just the frozen output layer applied to them.

Row i of the draft's input is the hidden state at position i; its output, after the draft's
own RMSNorm (initialised to the target's final norm weight), predicts the hidden state at
position i + 1. Drafting continues from its own predictions, so no token ever enters the
draft: a token only shapes the *sampling*, through token-info E(t) (token_info.py).

The draft keeps its own KV cache over target rows only; the caller commits those, and rows of
its own predictions are written past them and forgotten (truncate) after each chain.
The target's embedding (for E) and output layer are shared (frozen, not copied, not saved).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from foretell.errors import ForetellError
from foretell.hot_vocab import HotVocab, checked_vocab_ids
from foretell.kv_cache import KVCache
from foretell.models.config import ModelConfig
from foretell.models.drafter_module import DrafterModule, TargetSizes, check_target_sizes
from foretell.models.module_folder import (
    HIDDEN_DRAFT_FORMAT, WEIGHTS_FILE, load_weights, read_config, save_module, saved_folder,
)
from foretell.models.token_info import TokenInfo
from foretell.models.transformer import DecoderLayer, RotaryTables, Transformer, make_norm, softcap
from foretell.paths import default_cache_dir

if TYPE_CHECKING:
    from foretell.runtime.lean_drafters import LayersPass

FOLDER_FORMAT = HIDDEN_DRAFT_FORMAT
FORMAT, FORMAT_VERSION, CONFIG_FILE = FOLDER_FORMAT.name, FOLDER_FORMAT.version, FOLDER_FORMAT.config_file


@dataclass(frozen=True)
class HiddenDraftConfig(TargetSizes):  # the draft reads and predicts the target's hidden states
    target_num_layers: int  # the draft reads hook layer target_num_layers (the final-normed states)
    token_info_rank: int = 256  # r of W_1 [H, r], W_2 [r, V]; 0 = no token-info weights
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    # 0: the draft scores the whole vocabulary (or a hot vocabulary chosen at load). N: it was trained on its own
    # N-token draft vocabulary (the buffer vocab_ids), scores only those (W_2 [r, N]) and always drafts among them.
    draft_vocab_size: int = 0

    def __post_init__(self):
        if self.token_info_rank < 0:
            raise ForetellError(f"token_info_rank must be >= 0 (0 = no token-info), got {self.token_info_rank}")
        if not 0 <= self.draft_vocab_size <= self.vocab_size:
            raise ForetellError(f"draft_vocab_size must be in 0..{self.vocab_size} (0 = the whole vocabulary), "
                                f"got {self.draft_vocab_size}")

    @property
    def output_size(self) -> int:
        """Columns of the draft's logits before any load-time hot vocabulary: its own vocabulary, or the target's."""
        return self.draft_vocab_size or self.vocab_size

    @classmethod
    def for_target(cls, target: ModelConfig, token_info_rank: int = 256, draft_vocab_size: int = 0) -> "HiddenDraftConfig":
        """Sizes taken from the target (hidden size, heads, MLP width, RoPE)."""
        return cls(
            hidden_size=target.hidden_size,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=target.head_dim,
            intermediate_size=target.intermediate_size,
            vocab_size=target.vocab_size,
            target_num_layers=target.num_hidden_layers,
            token_info_rank=token_info_rank,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            attention_bias=target.attention_bias,
            draft_vocab_size=draft_vocab_size,
        )

    def layer_config(self, target: ModelConfig) -> ModelConfig:
        """The draft layer's sizes, with the target family's layer features (so a target layer's weights fit it)."""
        return target.drafter_layers(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, attention_bias=self.attention_bias,
        )

    def check_target(self, target: ModelConfig) -> None:
        check_target_sizes(self, target, "hidden-state draft", "a hidden-state draft")


@dataclass(frozen=True)
class SharedParts:
    """The target's modules the draft uses. A plain dataclass, so nn.Module neither registers
    nor saves them: they stay the target's (frozen) weights."""

    embed_tokens: nn.Embedding  # W_E of token-info
    lm_head: nn.Module  # the full output layer, or its hot-vocabulary rows
    hot: HotVocab | None = None
    final_softcap: float | None = None  # the target's logit soft-cap (Gemma 2), applied as the target does


class HiddenDraft(DrafterModule):
    placed_by = "norm"

    def __init__(self, config: HiddenDraftConfig, target: Transformer, hot: HotVocab | None = None):
        super().__init__()
        config.check_target(target.config)
        self.config = config
        layer_config = config.layer_config(target.config)
        self.layer = DecoderLayer(layer_config)
        self.norm = make_norm(layer_config, config.hidden_size)  # the kind of the target's final norm it starts as
        r = config.token_info_rank
        self.token_info = TokenInfo(config.hidden_size, r, config.output_size) if r > 0 else None
        if config.draft_vocab_size:  # its own vocabulary: a load-time hot vocabulary does not apply
            self.register_buffer("vocab_ids", torch.arange(config.draft_vocab_size))
            hot = HotVocab(self.vocab_ids, config.vocab_size)
        # Cutting the hot rows builds an nn.Linear, whose init draws from the RNG; keep the
        # stream untouched so a seed gives the same weights with or without a hot vocabulary.
        with torch.random.fork_rng(devices=[]):
            lm_head = hot.head(target.lm_head) if hot is not None else target.lm_head
        self.shared = SharedParts(target.embed_tokens, lm_head, hot, target.config.final_softcap)
        self.rotary = RotaryTables(config.head_dim, config.rope_theta, None, 0)
        self.lean = None  # runtime/drafter_modules.use_lean_step: a step in one native call, the chain's logits in
        # the column kernel
        self.to(dtype=target.dtype, device=target.device)

    def set_draft_vocab(self, ids: torch.Tensor, target: Transformer) -> None:
        """Make `ids` (ascending, distinct target ids) the draft's own vocabulary: its output layer becomes those
        rows of the target's (frozen, not saved) and E's columns follow W_2's rows in that order."""
        ids = checked_vocab_ids(ids, self.config.draft_vocab_size, self.config.vocab_size, "a hidden-state draft")
        with torch.no_grad():
            self.vocab_ids.copy_(ids)
        hot = HotVocab(ids, self.config.vocab_size)
        with torch.random.fork_rng(devices=[]):
            self.shared = replace(self.shared, lm_head=hot.head(target.lm_head), hot=hot)

    @property
    def target_layer(self) -> int:
        """The hook layer the draft reads: the target's final-normed hidden states."""
        return self.config.target_num_layers

    @property
    def output_ids(self) -> torch.Tensor | None:
        """Full-vocabulary id of each output column (the hot ids), or None when columns are ids."""
        return self.shared.hot.ids if self.shared.hot is not None else None

    def _layer(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, mask) -> torch.Tensor:
        cos, sin = self.rope(positions)
        return self.norm(self.layer(x, cos, sin, cache, 0, mask))

    def native_step(self, hidden: torch.Tensor, cache: KVCache) -> LayersPass | None:
        """step()'s pass where it runs in the lean step (run alone, or packed with other requests' passes:
        runtime/packed.run_draft_passes), else None; checks the rows and the cache's room either way."""
        T = hidden.shape[0]
        if T < 1:
            raise ValueError("the hidden-state draft needs at least one row per step")
        cache.check_room(T)
        if not self.native(T):
            return None
        return self.lean.layers_pass(hidden, torch.arange(cache.length, cache.length + T, device=self.device), cache)

    def step(self, hidden: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed T >= 1 hidden rows [T, H] at positions cache.length ..; return [T, H] predictions.

        Output row i predicts the (final-normed) hidden state one position after input row i.
        Writes T cache slots without committing them (the caller commits or truncates).
        """
        native = self.native_step(hidden, cache)
        if native is not None:
            return native.run()
        T, start = hidden.shape[0], cache.length
        positions = torch.arange(start, start + T, device=self.device)
        mask = None  # one row sees the whole cache
        if T > 1:
            causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
            mask = torch.cat([torch.ones(T, start, dtype=torch.bool, device=self.device), causal], dim=1)[None, None]
        return self._layer(hidden.to(self.dtype)[None], positions, cache, mask)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] predicted states -> [..., V_out] float32 logits (V_out: hot ids, or the vocabulary)."""
        if self.native() and hidden.dim() == 2:
            out = self.lean.logits(hidden)  # (the lean step takes no draft with a soft-cap)
            if out is not None:
                return out
        out = self.shared.lm_head(hidden.to(self.dtype))
        if self.shared.final_softcap is not None:
            out = softcap(out, self.shared.final_softcap)
        return out.float()

    def info(self, tokens: torch.Tensor) -> torch.Tensor:
        """E(t) for [n] token ids (full-vocabulary ids) -> [n, V_out] float32; zeros without token-info."""
        n = tokens.shape[0]
        if self.token_info is None:
            width = self.shared.hot.size if self.shared.hot is not None else self.config.vocab_size
            return torch.zeros(n, width, device=self.device)
        embedded = self.shared.embed_tokens(tokens.to(self.device)).detach()  # W_E is frozen
        if self.shared.hot is not None and not self.config.draft_vocab_size:  # W_2 over the vocabulary: its hot rows
            return self.token_info.hot_forward(embedded, self.shared.hot.ids)
        return self.token_info(embedded)

    def forward_training(self, hidden: torch.Tensor, steps: int) -> torch.Tensor:
        """Unroll `steps` draft steps from every position of whole sequences (cache-free, for training).

        hidden: [B, T, H] target final-normed states of positions 0..T-1. Returns [B, T, steps, H]:
        [b, t, j] is the draft's prediction of the state at position t + j + 1 after seeing the
        target's rows 0..t and then its own j previous predictions, exactly what inference gives
        (compare with the rows [t + j + 1] of `hidden` where they exist). Step j recomputes the
        blocks before it (one layer, so this costs steps^2 / 2 layer passes; fine for k <= 5).
        """
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        B, T, _ = hidden.shape
        blocks = [hidden.to(self.dtype)]
        preds = []
        for j in range(steps):
            positions, mask = unrolled_layout(T, j + 1, self.device)
            out = self._layer(torch.cat(blocks, dim=1), positions, None, mask[None, None])
            pred = out[:, j * T :]
            preds.append(pred)
            blocks.append(pred)
        return torch.stack(preds, dim=2)


def unrolled_layout(num_context: int, num_blocks: int, device: torch.device | str = "cpu"):
    """Positions [S] and mask [S, S] bool (S = num_blocks * T) for forward_training.

    Block 0 holds the target rows 0..T-1 (causal). Block j >= 1, row t, is the draft's j-th own
    prediction from anchor t, at position t + j: it sees target rows 0..t and rows t of blocks
    1..j, as at inference.
    """
    T = num_context
    S = num_blocks * T
    eye = torch.eye(T, dtype=torch.bool, device=device)
    mask = torch.zeros(S, S, dtype=torch.bool, device=device)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    positions = []
    for j in range(num_blocks):
        rows = slice(j * T, (j + 1) * T)
        mask[rows, :T] = causal
        for i in range(1, j + 1):
            mask[rows, i * T : (i + 1) * T] = eye
        positions.append(torch.arange(T, device=device) + j)
    return torch.cat(positions), mask


def new_hidden_draft(
    target: Transformer,
    config: HiddenDraftConfig | None = None,
    seed: int = 0,
    hot: HotVocab | None = None,
    init_from_layer: int | None = None,
    draft_vocab: torch.Tensor | None = None,
) -> HiddenDraft:
    """An untrained draft for `target` (tests, and training's start).

    draft_vocab: with config.draft_vocab_size, the draft's own vocabulary (ascending target ids; default the first
    draft_vocab_size ids).

    init_from_layer: copy that target decoder layer's weights (0-based; the seed suggests a
    middle one, e.g. num_layers // 2) instead of a random initialisation. The output norm
    starts as the target's final norm either way, so predictions begin on the right scale.
    """
    config = config or HiddenDraftConfig.for_target(target.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = HiddenDraft(config, target, hot)
        if config.draft_vocab_size:
            draft.set_draft_vocab(draft_vocab if draft_vocab is not None else torch.arange(config.draft_vocab_size), target)
        if draft.token_info is not None:  # small W_1 so that E starts near 0 once W_2 moves
            nn.init.normal_(draft.token_info.down.weight, 0.0, config.hidden_size**-0.5)
    with torch.no_grad():
        draft.norm.weight.copy_(target.norm.weight)
        if init_from_layer is not None:
            if not 0 <= init_from_layer < len(target.layers):
                raise ForetellError(
                    f"init_from_layer must be a target layer in 0..{len(target.layers) - 1}, got {init_from_layer}"
                )
            draft.layer.load_state_dict(target.layers[init_from_layer].state_dict())
    return draft


def save_hidden_draft(draft: HiddenDraft, folder: str | Path) -> Path:
    """Write hidden_draft.json (format and config) and model.safetensors (the draft's own weights)."""
    return save_module(draft, draft.config, folder, FOLDER_FORMAT)


def read_hidden_draft_config(folder: Path) -> HiddenDraftConfig:
    return read_config(saved_folder(folder, FOLDER_FORMAT), HiddenDraftConfig, FOLDER_FORMAT)


def load_hidden_draft(folder: str | Path, target: Transformer, hot: HotVocab | None = None) -> HiddenDraft:
    """Load a draft saved by save_hidden_draft onto `target` (its dtype and device). `hot` (a load-time hot
    vocabulary) is ignored by a draft trained on its own vocabulary: it drafts among that one. `folder` may be the
    --out folder of the training run that saved it."""
    folder = saved_folder(folder, FOLDER_FORMAT)
    config = read_hidden_draft_config(folder)
    config.check_target(target.config)
    draft = HiddenDraft(config, target, None if config.draft_vocab_size else hot)
    load_weights(draft, folder, FOLDER_FORMAT)
    if config.draft_vocab_size:
        try:
            draft.set_draft_vocab(draft.vocab_ids.clone(), target)
        except ForetellError as e:
            raise ForetellError(f"{folder / WEIGHTS_FILE}: {e}; the file is damaged") from None
    return draft.to(dtype=target.dtype, device=target.device)


INSTALL_DIR = "hidden-drafts"  # under the foretell cache: one installed draft per target name


def installed_hidden_draft_dir(target_name: str, cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / INSTALL_DIR / Path(target_name).name


def installed_hidden_draft(target_name: str, cache_dir: Path | None = None) -> Path | None:
    """The draft installed for this target (`foretell train hidden-state --install`), or None."""
    folder = installed_hidden_draft_dir(target_name, cache_dir)
    return folder if (folder / CONFIG_FILE).is_file() else None


def install_hidden_draft(folder: str | Path, target_name: str, cache_dir: Path | None = None) -> Path:
    """Copy a saved draft to where `foretell generate` looks for this target's default drafter.
    The copy lands under a temporary name first, so an interrupted install leaves the old draft whole."""
    folder = saved_folder(folder, FOLDER_FORMAT)  # a training run's folder: the draft it saved, not the run
    read_hidden_draft_config(folder)  # a clear error for a folder that is not a saved draft
    dest = installed_hidden_draft_dir(target_name, cache_dir)
    staging = dest.with_name(dest.name + ".installing")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(folder, staging)
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest
