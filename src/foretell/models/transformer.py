"""A compact native Llama / Qwen2 decoder for batch-size-1 decoding on any device.

Why native instead of wrapping transformers: at 135M parameters on a CPU the forward is
overhead-bound, so fused projections, a static cache and no per-call bookkeeping matter more
than anything else; and the tree mask, positions and cache are plain arguments here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from foretell.kv_cache import KVCache
from foretell.models.config import ModelConfig


@dataclass
class ForwardOutput:
    logits: torch.Tensor | None  # [T, V] float32 (batch size 1 squeezed); [B, T, V] from forward_sequences
    hidden: dict[int, torch.Tensor]  # layer index -> [T, H] ([B, T, H]); 0 = embeddings, L = final normed


def rope_tables(head_dim: int, theta: float, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # [S, D], the rotate-half layout
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


# Bumped whenever the forward's cost changes, so measured cost curves (budget.py) are redone.
RUNTIME_VERSION = 3

# Passes of up to this many new tokens use plain matmul attention: at one token PyTorch's fused
# CPU attention costs more than the matmuls themselves, but from two tokens on (verification
# passes) it is the faster one, by 2-5 ms a 135M-target pass at 4-13 tokens (bf16, 2 cores).
SMALL_STEP = 1


def small_step_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention of a few new queries over the cache. q: [B, Hq, T, D]; k, v: [B, Hkv, S, D];
    mask: [B or 1, 1, T, S] bool or None (all visible). Query heads share kv heads in groups (GQA)."""
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = Hq // Hkv
    qg = q.reshape(B, Hkv, group * T, D)  # head h reads kv head h // group
    scores = (qg @ k.transpose(-1, -2)).float() * D**-0.5
    if mask is not None:
        scores = scores.view(B, Hkv, group, T, S).masked_fill(~mask[:, :, None], float("-inf"))
    probs = scores.view(B, Hkv, group * T, S).softmax(dim=-1).to(v.dtype)
    return (probs @ v).view(B, Hq, T, D)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as the reference implementation does, then scale in the model dtype.
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_dim + 2 * kv_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, cache: KVCache | None, layer: int, mask):
        """x: [B, T, H]. With a cache attend to its prefix (mask: [B or 1, 1, T, S]); without, causally within x."""
        B, T = x.shape[:2]
        q, k, v = self.qkv_proj(self.input_layernorm(x)).split(self.split, dim=-1)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.write(layer, k, v)
        if cache is not None and T <= SMALL_STEP:
            attn = small_step_attention(q, k, v, mask)
        else:
            attn = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=cache is None and mask is None,
                enable_gqa=self.num_kv_heads != self.num_heads,
            )
        x = x + self.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._rope_len = 0
        self._cos = self._sin = None

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def new_cache(self, capacity: int) -> KVCache:
        c = self.config
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, capacity, self.dtype, self.device)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        need = int(positions.max()) + 1
        if need > self._rope_len:
            length = max(need, 2 * self._rope_len, 256)
            cos, sin = rope_tables(self.config.head_dim, self.config.rope_theta, length, self.device)
            self._cos, self._sin, self._rope_len = cos, sin, length
        # Tables stay fp32; cast the gathered rows so q/k rotate in the model dtype like the reference.
        return self._cos[positions].to(self.dtype), self._sin[positions].to(self.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
        hidden_layers: tuple[int, ...] = (),
        logits_rows: torch.Tensor | slice | None = None,
    ) -> ForwardOutput:
        """Run T new tokens after the cache's committed prefix.

        input_ids, positions: [T] long. tree_mask: [T, K] bool with K >= T: which of the last K
        slots (the committed tail plus the T new ones) each new token may see (None = causal);
        slots before those K are always visible. hidden_layers: which layer
        outputs to return (0 = embeddings, num_layers = final norm). logits_rows: which rows
        to project to the vocabulary (default all).
        """
        T = input_ids.shape[0]
        cache.check_room(T)
        mask = self._attention_mask(T, cache.length, tree_mask)
        cos, sin = self._rope(positions)
        cos, sin = cos[None, None], sin[None, None]  # [1, 1, T, D]
        x = self.embed_tokens(input_ids)[None]
        hidden: dict[int, torch.Tensor] = {}
        if 0 in hidden_layers:
            hidden[0] = x[0]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, mask)
            if i + 1 in hidden_layers and i + 1 < len(self.layers):
                hidden[i + 1] = x[0]
        x = self.norm(x)[0]
        if len(self.layers) in hidden_layers:
            hidden[len(self.layers)] = x
        if logits_rows is not None:
            x = x[logits_rows]
        return ForwardOutput(logits=self.lm_head(x).float(), hidden=hidden)

    def forward_sequences(
        self, input_ids: torch.Tensor, hidden_layers: tuple[int, ...] = (), with_logits: bool = True
    ) -> ForwardOutput:
        """Full causal forward over a batch [B, T] without a cache (training, feature extraction).

        Returns logits [B, T, V] (model dtype, for autograd) and hidden states [B, T, H].
        Right padding is harmless: causal attention never lets a real token see a pad after it.
        """
        B, T = input_ids.shape
        cos, sin = self._rope(torch.arange(T, device=input_ids.device))
        cos, sin = cos[None, None], sin[None, None]
        x = self.embed_tokens(input_ids)
        hidden: dict[int, torch.Tensor] = {0: x} if 0 in hidden_layers else {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None, i, None)
            if i + 1 in hidden_layers and i + 1 < len(self.layers):
                hidden[i + 1] = x
        x = self.norm(x)
        if len(self.layers) in hidden_layers:
            hidden[len(self.layers)] = x
        return ForwardOutput(logits=self.lm_head(x) if with_logits else None, hidden=hidden)

    def _attention_mask(self, T: int, prefix: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        if tree_mask is None:
            if T == 1:
                return None
            tree_mask = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        visible = torch.ones(T, prefix + T - tree_mask.shape[1], dtype=torch.bool, device=self.device)
        return torch.cat([visible, tree_mask.to(self.device)], dim=1)[None, None]

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load weights named as in transformers' Llama/Qwen2 checkpoints, fusing projections."""
        own: dict[str, torch.Tensor] = {}

        def take(name: str) -> torch.Tensor:
            try:
                return state.pop(name)
            except KeyError:
                raise KeyError(f"checkpoint lacks tensor {name!r}") from None

        own["embed_tokens.weight"] = take("model.embed_tokens.weight")
        own["norm.weight"] = take("model.norm.weight")
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        else:
            own["lm_head.weight"] = state.pop("lm_head.weight", own["embed_tokens.weight"])
        for i in range(self.config.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = p + "self_attn."
            own[f"layers.{i}.qkv_proj.weight"] = torch.cat(
                [take(attn + f"{n}_proj.weight") for n in "qkv"], dim=0
            )
            if self.config.attention_bias:
                own[f"layers.{i}.qkv_proj.bias"] = torch.cat([take(attn + f"{n}_proj.bias") for n in "qkv"])
            own[f"layers.{i}.o_proj.weight"] = take(attn + "o_proj.weight")
            own[f"layers.{i}.gate_up_proj.weight"] = torch.cat(
                [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], dim=0
            )
            own[f"layers.{i}.down_proj.weight"] = take(p + "mlp.down_proj.weight")
            own[f"layers.{i}.input_layernorm.weight"] = take(p + "input_layernorm.weight")
            own[f"layers.{i}.post_attention_layernorm.weight"] = take(p + "post_attention_layernorm.weight")
        leftovers = [k for k in state if "rotary_emb" not in k]
        if leftovers:
            raise KeyError(f"unexpected tensors in checkpoint: {leftovers[:5]}")
        missing, unexpected = self.load_state_dict(own, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and self.config.tie_word_embeddings)]
        if missing or unexpected:
            raise KeyError(f"weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")


def warm_up(model: Transformer, sizes: list[int]) -> None:
    """One forward per token count in `sizes` on a scratch cache (results discarded)."""
    sizes = [t for t in sizes if t >= 1]
    cache = model.new_cache(sum(sizes) + 1)
    for t in sizes:
        ids = torch.zeros(t, dtype=torch.long, device=model.device)
        model(ids, torch.arange(cache.length, cache.length + t, device=model.device), cache, logits_rows=slice(-1, None))
        cache.commit_prefix(t)
