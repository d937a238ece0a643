"""An EAGLE-3 draft head: one decoder layer over fused target hidden states, autoregressive over its own state.

Per committed position i the head reads the target's hidden states of `aux_layers` (low, middle and high
layers in foretell's hook indexing: 0 = embeddings, i = output of decoder layer i, L = final norm), fuses
them with `fc` (3H -> H) and pairs the result with the target's (frozen) embedding of token i + 1. Its one
layer (EAGLE-3's "midlayer") normalises the two halves separately (`input_layernorm` on the embedding,
`hidden_norm` on the hidden state), attends over their concatenation (2H wide queries, keys and values),
adds the attention output to the un-normalised hidden state (the residual), then runs a Llama MLP.
Its output before the final `norm` is the state the next draft step reads; after `norm` an own `lm_head`
scores a reduced draft vocabulary of `draft_vocab_size` tokens, whose target ids are
`column + d2t[column]` (t2d marks the target ids inside it), as the EAGLE-3 checkpoints vLLM and SGLang
load. A draft step at depth d > 1 feeds the token drafted at depth d - 1 and the state that drafted it.

The head keeps its own one-layer KV cache: context rows are committed, draft rows are written after them
and forgotten after each proposal. RoPE is the target's (rope_theta and its scaling), as the exported configuration
states. Checkpoints in the engines' layout are read and written by models/eagle3_format.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from foretell.errors import ForetellError
from foretell.kv_cache import KVCache
from foretell.models.config import ModelConfig
from foretell.models.drafter_module import DrafterModule, TargetSizes, check_target_sizes
from foretell.models.module_folder import (
    EAGLE3_FORMAT, read_config, save_module, saved_folder,
)
from foretell.models.rope import RopeScaling
from foretell.models.transformer import RMSNorm, RotaryTables, Transformer

FOLDER_FORMAT = EAGLE3_FORMAT
CONFIG_FILE = FOLDER_FORMAT.config_file
DEFAULT_DRAFT_VOCAB = 8192  # draft vocabulary of `foretell train eagle3` (EAGLE-3 uses 32000 of Llama 3's 128K)


def default_aux_layers(target_num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low / middle / high layers in foretell's indexing.

    vLLM and SGLang both default to the residual stream entering target layers 2, L // 2 and L - 3 (0-based),
    i.e. the outputs of layers 2, L // 2 and L - 3 counted from 1: foretell's hook layers (2, L // 2, L - 3).
    Shallow targets get distinct layers in 1..L - 1 (fewer than three when L < 4).
    """
    L = target_num_layers
    wanted = (2, L // 2, L - 3)
    if len(set(wanted)) == 3 and min(wanted) >= 1:
        return wanted
    top = max(1, L - 1)
    return tuple(sorted({min(max(1, x), top) for x in (1, L // 2, L - 1)}))


@dataclass(frozen=True)
class Eagle3Config(TargetSizes):
    draft_vocab_size: int  # columns of the head's own lm_head
    target_num_layers: int
    aux_layers: tuple[int, ...]  # target hook layers fused by fc, ascending (the order the engines capture them)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    rope_scaling: dict | None = None  # transformers' rope_parameters of a scaled RoPE (rope_theta aside), or None

    def __post_init__(self):
        object.__setattr__(self, "aux_layers", tuple(int(x) for x in self.aux_layers))
        self.scaling()  # a clear error for an unsupported scaling
        layers = self.aux_layers
        if not layers or list(layers) != sorted(set(layers)) or min(layers) < 0 or max(layers) > self.target_num_layers:
            raise ForetellError(f"aux_layers must be distinct ascending target layers in 0..{self.target_num_layers}, "
                                f"got {list(layers)}")
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ForetellError(f"draft_vocab_size must be in 1..{self.vocab_size} (the target's vocabulary), "
                                f"got {self.draft_vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ForetellError("num_attention_heads must be a multiple of num_key_value_heads")

    def scaling(self) -> RopeScaling | None:
        return RopeScaling.from_hf(self.rope_scaling) if self.rope_scaling else None

    @classmethod
    def for_target(cls, target: ModelConfig, draft_vocab_size: int | None = None,
                   aux_layers: Sequence[int] | None = None) -> Eagle3Config:
        """Sizes from the target; the draft vocabulary defaults to DEFAULT_DRAFT_VOCAB (at most the vocabulary)."""
        layers = tuple(sorted(aux_layers)) if aux_layers is not None else default_aux_layers(target.num_hidden_layers)
        return cls(
            hidden_size=target.hidden_size, num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim,
            intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
            draft_vocab_size=min(draft_vocab_size or DEFAULT_DRAFT_VOCAB, target.vocab_size),
            target_num_layers=target.num_hidden_layers, aux_layers=layers, rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta, max_position_embeddings=target.max_position_embeddings,
            rope_scaling=rope_parameters(target.rope_scaling),
        )

    def check_target(self, target: ModelConfig) -> None:
        check_target_sizes(self, target, "EAGLE-3 head", "a head")


def rope_parameters(scaling: RopeScaling | None) -> dict | None:
    """A RopeScaling as transformers' flat rope_parameters dict (unset fields left out), JSON-ready."""
    if scaling is None:
        return None
    out = {}
    for key, value in asdict(scaling).items():
        if value is not None and value != () and not (key == "truncate" and value is True):
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


class Eagle3Layer(nn.Module):
    """EAGLE-3's midlayer, split into its steps so training can attend over several unrolled blocks."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        H, D = c.hidden_size, c.head_dim
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, D
        self.split = (self.heads * D, self.kv_heads * D, self.kv_heads * D)
        self.input_layernorm = RMSNorm(H, c.rms_norm_eps)  # on the token embedding
        self.hidden_norm = RMSNorm(H, c.rms_norm_eps)  # on the hidden state
        self.qkv_proj = nn.Linear(2 * H, sum(self.split), bias=False)
        self.o_proj = nn.Linear(self.heads * D, H, bias=False)
        self.post_attention_layernorm = RMSNorm(H, c.rms_norm_eps)
        self.gate_up_proj = nn.Linear(H, 2 * c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, H, bias=False)

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """[B, T, H] each -> q [B, Hq, T, D], k and v [B, Hkv, T, D], rotated."""
        B, T = hidden.shape[:2]
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def attend(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        """q [B, Hq, T, D] over k, v [B, Hkv, S, D]; mask [.., T, S] bool (None: every key visible)."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        B, _, T, _ = q.shape
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The residual adds and the MLP: the layer's output before the head's final norm."""
        x = residual + attn
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@dataclass(frozen=True)
class SharedEmbedding:
    """The target's token embedding, shared (frozen, not copied, not saved): a plain dataclass, so
    nn.Module neither registers nor saves it."""

    embed_tokens: nn.Module


class Eagle3Head(DrafterModule):
    placed_by = "fc"

    def __init__(self, config: Eagle3Config, target: Transformer):
        super().__init__()
        config.check_target(target.config)
        self.config = config
        H = config.hidden_size
        self.fc = nn.Linear(len(config.aux_layers) * H, H, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.draft_vocab_size, bias=False)
        # EAGLE-3's id maps: target id of draft column j = j + d2t[j]; t2d[t] = token t is in the draft vocabulary.
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.shared = SharedEmbedding(target.embed_tokens)
        # The target's RoPE, its scaling included; the tables grow with the positions asked for.
        self.rotary = RotaryTables(config.head_dim, config.rope_theta, config.scaling(), config.max_position_embeddings)
        self.lean = None  # runtime/drafter_modules.use_lean_step: a step and its logits in one native call
        self.to(dtype=target.dtype, device=target.device)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """fc of target features [..., F] -> [..., H] (in the lean step's column kernel where it runs)."""
        if self.native() and features.dim() == 2:
            fused = self.lean.fuse(features)
            if fused is not None:
                return fused
        return self.fc(features.to(self.device, self.dtype))

    @property
    def vocab_ids(self) -> torch.Tensor:
        """[draft_vocab_size] the target id of each lm_head column."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        """Make the draft vocabulary the target ids `ids` (ascending), filling d2t and t2d."""
        ids = torch.as_tensor(ids, dtype=torch.long).sort().values.to(self.d2t.device)
        if len(ids) != self.config.draft_vocab_size or len(ids.unique()) != len(ids):
            raise ForetellError(f"the draft vocabulary needs {self.config.draft_vocab_size} distinct ids, got {len(ids)}")
        self.d2t.copy_(ids - torch.arange(len(ids), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def check_vocab_maps(self, source: Path | str) -> None:
        """d2t and t2d must describe the same set of target ids, each a real token; `source` names the weights
        file they came from."""
        ids = self.vocab_ids
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size or len(ids.unique()) != len(ids):
            raise ForetellError(f"{source}: its d2t maps draft columns outside the target vocabulary or twice to one "
                                "token; the file is damaged or made for another target")
        if int(self.t2d.sum()) != len(ids) or not bool(self.t2d[ids].all()):
            raise ForetellError(f"{source}: its t2d does not mark exactly the tokens d2t maps to; the file is damaged")

    def features(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """[..., len(aux_layers) * H]: the aux layers' hidden states side by side, in layer order."""
        missing = [layer for layer in self.config.aux_layers if layer not in hidden]
        if missing:
            raise ForetellError(f"the EAGLE-3 head needs target hidden layers {missing}, which were not provided")
        return torch.cat([hidden[layer] for layer in self.config.aux_layers], dim=-1)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.shared.embed_tokens(tokens.to(self.device)).detach().to(self.dtype)

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """[..., H] layer outputs (before the final norm) -> [..., draft_vocab_size] float32 logits."""
        return self.lm_head(self.norm(state)).float()

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache,
             tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """T new rows after the cache's prefix: the embeddings of `tokens` [T] with `hidden` [T, H] (fc of
        target features, or the parent rows' outputs) at `positions` [T]. tree_mask [T, K] bool: which of the
        last K slots (earlier new rows and these) each row sees, earlier slots always visible; None = causal
        among the new rows. Writes T slots (the caller commits or truncates); returns the outputs [T, H]."""
        T = tokens.shape[0]
        cache.check_room(T)
        cos, sin = self.rope(positions)
        hidden = hidden.to(self.dtype)[None]
        q, k, v = self.midlayer.qkv(self.embed(tokens)[None], hidden, cos, sin)
        k, v = cache.write(0, k, v)
        mask = visible_mask(T, cache.length, tree_mask, self.device)
        return self.midlayer.finish(self.midlayer.attend(q, k, v, mask), hidden)[0]

    def step_and_logits(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                        tree_mask: torch.Tensor | None = None, last_only: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """step(), then the draft logits of its rows (only the last row's with last_only, where that saves time):
        in one native call where runtime/drafter_modules.use_lean_step took."""
        if self.native(tokens.shape[0]):
            cache.check_room(tokens.shape[0])
            return self.lean(self.embed(tokens), hidden, positions, cache, tree_mask, last_only)
        out = self.step(tokens, hidden, positions, cache, tree_mask)
        return out, self.logits(out[-1:] if last_only else out)

    def forward_training(self, features: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor,
                         steps: int) -> torch.Tensor:
        """EAGLE-3's training-time test: `steps` unrolled draft steps from many anchors, cache-free.

        features: [B, R, F] target features of positions 0..R-1 (R > max anchor); ids: [B, >= R + steps] the
        sequence's tokens; anchors [A] ascending context rows. Step 0 runs the context rows 0..R-1 (causal;
        row i reads fc(features i) and the embedding of token i + 1). Step j >= 1 runs one row per anchor a:
        the embedding of the true token a + 1 + j with the anchor's step j - 1 output, at position a + j,
        seeing context rows 0..a and the anchor's own rows of steps 1..j, exactly as inference sees a chain.
        Returns the outputs [B, A, steps, H] (before the final norm): [b, k, j] scores token anchors[k] + 2 + j.
        """
        B, R = features.shape[:2]
        A = len(anchors)
        dev = self.device
        anchors = anchors.to(dev)
        hidden = self.fc(features.to(dev, self.dtype))
        cos, sin = self.rope(torch.arange(R, device=dev))
        q, k, v = self.midlayer.qkv(self.embed(ids[:, 1 : R + 1]), hidden, cos, sin)
        causal = torch.ones(R, R, dtype=torch.bool, device=dev).tril()
        out = self.midlayer.finish(self.midlayer.attend(q, k, v, causal), hidden)
        state = out[:, anchors]  # [B, A, H]
        outputs = [state]
        context = (anchors[:, None] >= torch.arange(R, device=dev)).unsqueeze(0)  # [1, A, R]
        own = torch.eye(A, dtype=torch.bool, device=dev)
        keys, values = [k], [v]
        for j in range(1, steps):
            tokens = ids[:, (anchors + 1 + j).clamp(max=ids.shape[1] - 1)]
            cos, sin = self.rope(anchors + j)
            qj, kj, vj = self.midlayer.qkv(self.embed(tokens), state, cos, sin)
            keys.append(kj)
            values.append(vj)
            mask = torch.cat([context[0]] + [own] * j, dim=1)  # [A, R + j * A]
            attn = self.midlayer.attend(qj, torch.cat(keys, dim=2), torch.cat(values, dim=2), mask)
            state = self.midlayer.finish(attn, state)
            outputs.append(state)
        return torch.stack(outputs, dim=2)


def visible_mask(T: int, prefix: int, tree_mask: torch.Tensor | None, device) -> torch.Tensor | None:
    """[1, 1, T, prefix + T] bool for T new rows after `prefix` cache slots (None: one row sees everything)."""
    if tree_mask is None:
        if T == 1:
            return None
        tree_mask = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    visible = torch.ones(T, prefix + T - tree_mask.shape[1], dtype=torch.bool, device=device)
    return torch.cat([visible, tree_mask.to(device)], dim=1)[None, None]


def new_eagle3_head(target: Transformer, config: Eagle3Config | None = None, seed: int = 0,
                    draft_vocab: torch.Tensor | None = None) -> Eagle3Head:
    """An untrained head for `target` (tests, and training's start): random fc and midlayer, unit norms,
    the final norm and lm_head rows copied from the target's (so the head starts on the target's scale).

    draft_vocab: the target ids of the draft vocabulary (default: the first draft_vocab_size ids)."""
    config = config or Eagle3Config.for_target(target.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = Eagle3Head(config, target)
    ids = draft_vocab if draft_vocab is not None else torch.arange(config.draft_vocab_size)
    with torch.no_grad():
        head.set_draft_vocab(ids)
        head.lm_head.weight.copy_(target.lm_head.weight[head.vocab_ids.to(target.device)])
        head.norm.weight.copy_(target.norm.scale())
    return head


def save_eagle3_head(head: Eagle3Head, folder: str | Path) -> Path:
    """Write eagle3.json (format and config) and model.safetensors (the head's own weights and id maps)."""
    return save_module(head, head.config, folder, FOLDER_FORMAT)


def read_eagle3_config(folder: Path) -> Eagle3Config:
    return read_config(saved_folder(folder, FOLDER_FORMAT), Eagle3Config, FOLDER_FORMAT)
