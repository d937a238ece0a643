"""A compact native decoder for batch-size-1 decoding on any device: Llama, Mistral, Qwen2 / Qwen3, Gemma 1 / 2 / 3
and Phi-3 / Phi-4 in one model, each family a set of ModelConfig flags (config.py), never a copy of the layer.

Why native instead of wrapping transformers: at 135M parameters on a CPU the forward is
overhead-bound, so fused projections, a static cache and no per-call bookkeeping matter more
than anything else; and the tree mask, positions and cache are plain arguments here.
A flag that is off costs a Python `is None` test at most: Llama and Qwen2 keep their fast path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial

import torch
import torch.nn.functional as F
from torch import nn

from foretell.kv_cache import KVCache
from foretell.models.config import ModelConfig
from foretell.models.norms import OffsetRMSNorm, RMSNorm, make_norm  # noqa: F401 (drafters import them from here)
from foretell.models.rope import RopeScaling, rope_tables  # drafters import rope_tables from here too


@dataclass
class ForwardOutput:
    logits: torch.Tensor | None  # [T, V] float32 (batch size 1 squeezed); [B, T, V] from forward_sequences
    hidden: dict[int, torch.Tensor]  # layer index -> [T, H] ([B, T, H]); 0 = embeddings, L = final normed


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate only the first cos.shape[-1] dims of each head (a partial rotary factor, e.g. Phi-4-mini)."""
    r = cos.shape[-1]
    turned = x[..., :r]
    return torch.cat([turned * cos + rotate_half(turned) * sin, x[..., r:]], dim=-1)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's soft-capping: cap * tanh(x / cap), a smooth clamp to (-cap, cap)."""
    return torch.tanh(x / cap) * cap


# Bumped whenever the forward's cost changes, so measured cost curves (sizing/cost.py) are redone.
RUNTIME_VERSION = 11

# Passes of up to this many new tokens use plain matmul attention: at one token PyTorch's fused
# CPU attention costs more than the matmuls themselves, but from two tokens on (verification
# passes) it is the faster one, by 2-5 ms a 135M-target pass at 4-13 tokens (bf16, 2 cores).
SMALL_STEP = 1

ACTIVATION_FUNCTIONS = {
    "silu": F.silu, "swish": F.silu, "gelu": F.gelu, "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
}


def small_step_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    scale: float | None = None, cap: float | None = None, keys: int | None = None,
) -> torch.Tensor:
    """Attention as explicit matmuls. q: [B, Hq, T, D]; k, v: [B, Hkv, S', D] of which the first S = keys
    (None: all) are attended, the rest given zero weight (KVCache.block_views); mask: [B or 1, 1, T, S] bool or
    None (all visible). Query heads share kv heads in groups (GQA). scale: None = D ** -0.5; cap: soft-cap the
    scores (Gemma 2; SDPA cannot, so such layers come here at every size)."""
    B, Hq, T, D = q.shape
    Hkv, padded = k.shape[1], k.shape[2]
    S = padded if keys is None else keys
    group = Hq // Hkv
    qg = q.reshape(B, Hkv, group * T, D)  # head h reads kv head h // group
    scores = (qg @ k.transpose(-1, -2))[..., :S].float() * (D**-0.5 if scale is None else scale)
    if cap is not None:
        scores = softcap(scores, cap)
    if mask is not None:
        scores = scores.view(B, Hkv, group, T, S).masked_fill(~mask[:, :, None], float("-inf"))
    probs = scores.view(B, Hkv, group * T, S).softmax(dim=-1).to(v.dtype)
    if padded > S:
        probs = F.pad(probs, (0, padded - S))
    return (probs @ v).view(B, Hq, T, D)


def causal_mask(T: int, device) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()[None, None]


@cache
def _in_dtype(value: float, dtype: torch.dtype) -> float:
    return torch.tensor(value, dtype=dtype).item()


class ScaledEmbedding(nn.Embedding):
    """Gemma's embedding: rows times sqrt(hidden_size), the factor first rounded to the model dtype as in
    transformers (sqrt(3072) = 55.43 becomes 55.5 in bf16). Drafters reading the target's embedding get it too."""

    def __init__(self, num: int, dim: int, scale: float):
        super().__init__(num, dim)
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = super().forward(ids)
        return x * _in_dtype(self.scale, x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        self.rotary_dim = cfg.rotary_dim  # None: RoPE turns the whole head
        self.scale = cfg.attention_scale  # None: SDPA's default, head_dim ** -0.5
        self.attn_softcap = cfg.attn_softcap
        self.act = ACTIVATION_FUNCTIONS[cfg.hidden_act]
        # Attention over the cache in fp32: where bf16 matmuls are emulated (runtime/wide_linear.py sets it) the
        # one-token step's two tiny products cost ~2x more in bf16 than converting the cached keys and values, and
        # wider passes follow so that verification computes what plain steps do (up to summation order).
        self.attention_fp32 = False
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_dim + 2 * kv_dim, bias=cfg.attention_bias)
        self.q_norm = make_norm(cfg, self.head_dim) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, self.head_dim) if cfg.qk_norm else None
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.o_proj_bias)
        # Gemma 2 / 3 normalise the attention and MLP outputs before each residual add ("sandwich" norms).
        self.attn_output_norm = make_norm(cfg, cfg.hidden_size) if cfg.sandwich_norms else None
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)  # the MLP's input norm
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.mlp_output_norm = make_norm(cfg, cfg.hidden_size) if cfg.sandwich_norms else None

    def forward(self, x, cos, sin, cache: KVCache | None, layer: int, mask, kv_start: int = 0):
        """x: [B, T, H]. With a cache attend to its prefix (mask: [B or 1, 1, T, S]); without, causally within x.
        cos, sin: [.., T, R], R = rotary_dim or head_dim. kv_start: cache slots before it are out of every query's
        sliding window, so they are not read at all (the mask then covers slots kv_start..)."""
        q, k, v = self.project_qkv(x, cos, sin)
        return self.finish(x, self.attend(q, k, v, cache, layer, mask, kv_start))

    def forward_packed(self, x, cos, sin, layer: int, segments: list[tuple[KVCache, object, int, int, int]]):
        """Several requests' new tokens side by side in one row, x: [1, N, H]: the projections run once over all
        N tokens; attention runs per request over its own cache. segments: (cache, mask, kv_start, start, end),
        rows start..end of x belonging to that cache."""
        q, k, v = self.project_qkv(x, cos, sin)
        parts = [self.attend(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], cache, layer, mask, kv_start)
                 for cache, mask, kv_start, a, b in segments]
        padding = x.shape[1] - segments[-1][4]  # rows past the last segment belong to no request
        if padding:
            parts.append(q.new_zeros(q.shape[0], q.shape[1], padding, q.shape[3]))
        return self.finish(x, torch.cat(parts, dim=2))

    def project_qkv(self, x, cos, sin):
        """q [B, Hq, T, D], k and v [B, Hkv, T, D] of x [B, T, H], normed and rotated."""
        B, T = x.shape[:2]
        q, k, v = self.qkv_proj(self.input_layernorm(x)).split(self.split, dim=-1)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary_dim is None:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        else:
            q, k = partial_rope(q, cos, sin), partial_rope(k, cos, sin)
        return q, k, v

    def attend(self, q, k, v, cache: KVCache | None, layer: int, mask, kv_start: int):
        """Attention of the new queries over the cache's prefix and themselves (causally within them without one)."""
        T = q.shape[2]
        if cache is not None:
            k, v = cache.write(layer, k, v)
            if kv_start:
                k, v = k[:, :, kv_start:], v[:, :, kv_start:]
        small, keys = cache is not None and T <= SMALL_STEP, None
        if small and not kv_start:  # whole blocks of keys: one matrix shape per block rather than per key length
            keys = k.shape[2]
            k, v = cache.block_views(layer, keys)
        if k.dtype != q.dtype:  # a cache of another dtype (kv_dtype): its rows widened for the products
            k, v = k.to(q.dtype), v.to(q.dtype)
        if small:
            if self.attention_fp32 and q.dtype == torch.bfloat16:
                out = small_step_attention(q.float(), k.float(), v.float(), mask, self.scale, self.attn_softcap, keys)
                return out.to(q.dtype)
            return small_step_attention(q, k, v, mask, self.scale, self.attn_softcap, keys)
        if self.attn_softcap is not None:
            if mask is None and cache is None:
                mask = causal_mask(T, q.device)
            return small_step_attention(q, k, v, mask, self.scale, self.attn_softcap)
        wanted = q.dtype
        if self.attention_fp32 and wanted == torch.bfloat16 and cache is not None:
            q, k, v = q.float(), k.float(), v.float()
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=cache is None and mask is None,
            enable_gqa=self.num_kv_heads != self.num_heads, scale=self.scale,
        ).to(wanted)

    def finish(self, x, attn):
        """The attention output projected and added, then the MLP block."""
        B, T = x.shape[:2]
        out = self.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
        if self.attn_output_norm is not None:
            out = self.attn_output_norm(out)
        x = x + out
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        out = self.down_proj(self.act(gate) * up)
        if self.mlp_output_norm is not None:
            out = self.mlp_output_norm(out)
        return x + out


def packed_rows(rows: int) -> int:
    """rows rounded up to a multiple of 8 and of an eighth of the largest power of two <= rows: at most 12.5%
    more rows, eight shapes per doubling."""
    step = max(8, 1 << max(0, rows.bit_length() - 4))
    return -(-rows // step) * step


def last_position(positions: torch.Tensor, cache: KVCache, rows: int) -> int:
    """The longest position of a pass of `rows` new tokens: on CPU read from the positions; elsewhere bounded by the
    cache (committed slot i holds position i, and a pass's new tokens sit at most rows - 1 past the committed ones:
    a chain's last, or a tree's deepest node), so an accelerator's forward copies nothing back to the host (a CUDA
    graph's capture forbids that). A bound only sizes the rotary table and skips a sliding window's shortcut."""
    if positions.device.type == "cpu":
        return int(positions.max())
    return cache.length + rows - 1


class RotaryTables:
    """cos / sin rows by position for one RoPE, rebuilt (doubling) when a longer position comes."""

    def __init__(self, dim: int, theta: float, scaling: RopeScaling | None, max_positions: int):
        self.args = (dim, theta)
        self.scaling, self.max_positions = scaling, max_positions
        self.length = 0
        self.cos = self.sin = None

    def __call__(self, positions: torch.Tensor, last: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if last >= self.length:
            self.length = max(last + 1, 2 * self.length, 256)
            self.cos, self.sin = rope_tables(
                *self.args, self.length, positions.device, self.scaling, self.max_positions
            )
        # Tables stay fp32; cast the gathered rows so q/k rotate in the model dtype like the reference.
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        if cfg.embedding_scale is None:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        else:
            self.embed_tokens = ScaledEmbedding(cfg.vocab_size, cfg.hidden_size, cfg.embedding_scale)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = make_norm(cfg, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryTables(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
        # Gemma 3's sliding layers rotate with their own base; elsewhere every layer shares one table.
        self.local_rope = self.rope
        if cfg.local_rope_theta is not None:
            self.local_rope = RotaryTables(cfg.rope_dim, cfg.local_rope_theta, None, cfg.max_position_embeddings)
        self.sliding = frozenset(i for i in cfg.sliding_layers if i < cfg.num_hidden_layers)
        # Every layer attends alike (the Llama / Qwen2 fast path) unless some slide or rotate differently.
        self.uniform = not self.sliding and cfg.local_rope_theta is None
        self.compiled = False  # compile_steps()
        self.kv_dtype: torch.dtype | None = None  # its KV caches' dtype, None: the model's (RuntimeConfig.kv_dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def compile_steps(self) -> Transformer:
        """torch.compile each layer's projections-and-norms and MLP blocks (not attention, whose key length grows
        every step), with dynamic token counts so verification sizes do not recompile. Opt-in: on this 2-core CPU
        it has not paid (benchmarks/experiments/compile_ab.py); the cost curve is keyed by it (sizing/cost.machine_key)."""
        for layer in self.layers:
            layer.project_qkv = torch.compile(layer.project_qkv, dynamic=True)
            layer.finish = torch.compile(layer.finish, dynamic=True)
        self.compiled = True
        return self

    def new_cache(self, capacity: int) -> KVCache:
        c = self.config
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, capacity, self.kv_dtype or self.dtype,
                       self.device)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of the full-attention layers for `positions` (any shape), in the model dtype."""
        return self.rope(positions, int(positions.max()), self.dtype)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Normed hidden states -> logits in the model dtype (Gemma 2's final soft-cap included)."""
        logits = self.lm_head(x)
        return logits if self.config.final_softcap is None else softcap(logits, self.config.final_softcap)

    def _plan(self, full: tuple, local) -> list[tuple]:
        """Per layer (cos, sin, mask, kv_start): `full` for full-attention layers, `local()` for sliding ones."""
        if self.uniform:
            return [full] * len(self.layers)
        local_args = local()
        return [local_args if i in self.sliding else full for i in range(len(self.layers))]

    def _run(self, x, plan, cache, hidden_layers, squeeze: bool) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        hidden: dict[int, torch.Tensor] = {}
        if 0 in hidden_layers:
            hidden[0] = x[0] if squeeze else x
        for i, (layer, (cos, sin, mask, kv_start)) in enumerate(zip(self.layers, plan)):
            x = layer(x, cos, sin, cache, i, mask, kv_start)
            if i + 1 in hidden_layers and i + 1 < len(self.layers):
                hidden[i + 1] = x[0] if squeeze else x
        x = self.norm(x)
        if squeeze:
            x = x[0]
        if len(self.layers) in hidden_layers:
            hidden[len(self.layers)] = x
        return x, hidden

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
        to project to the vocabulary (default all). Sliding-window layers further hide keys at
        positions <= p - window from a query at position p (committed slot i holds position i).
        """
        T = input_ids.shape[0]
        cache.check_room(T)
        last = last_position(positions, cache, T)
        mask = self._attention_mask(T, cache.length, tree_mask)
        cos, sin = self.rope(positions, last, self.dtype)
        full = (cos[None, None], sin[None, None], mask, 0)  # [1, 1, T, R]
        x, hidden = self._run(
            self.embed_tokens(input_ids)[None], self._plan(full, lambda: self._local(positions, last, cache.length, mask)),
            cache, hidden_layers, squeeze=True,
        )
        if logits_rows is not None:
            x = x[logits_rows]
        return ForwardOutput(logits=self.project(x).float(), hidden=hidden)

    def forward_packed(self, passes: list) -> list[ForwardOutput]:
        """Several requests' passes (each with the fields of `forward`'s arguments: input_ids, positions, cache,
        tree_mask, hidden_layers, logits_rows; decoding.TargetPass) as one forward: the projections, the MLPs and
        the output layer run once over all their tokens, which is where a step's time goes at small batch sizes;
        attention runs per request over its own cache. Each output equals that pass run alone (up to float
        rounding of the larger matrix products)."""
        if len(passes) == 1:
            p = passes[0]
            return [self(p.input_ids, p.positions, p.cache, p.tree_mask, p.hidden_layers, p.logits_rows)]
        sizes = [p.input_ids.shape[0] for p in passes]
        bounds = [(sum(sizes[:i]), sum(sizes[: i + 1])) for i in range(len(sizes))]
        # Padded to a bucketed row count: the runtime keeps kernels and buffers per matrix shape, and the sums of
        # a changing batch's pass sizes are too many shapes to keep (memory grows with each new one).
        padding = packed_rows(sum(sizes)) - sum(sizes)
        input_ids = torch.cat([p.input_ids for p in passes] + [passes[-1].input_ids.new_zeros(padding)])
        positions = torch.cat([p.positions for p in passes] + [passes[-1].positions.new_zeros(padding)])
        lasts = [last_position(p.positions, p.cache, p.input_ids.shape[0]) for p in passes]
        cos, sin = self.rope(positions, max(lasts), self.dtype)
        full_segments, local_segments = [], []
        for p, (a, b), last in zip(passes, bounds, lasts):
            p.cache.check_room(b - a)
            mask = self._attention_mask(b - a, p.cache.length, p.tree_mask)
            full_segments.append((p.cache, mask, 0, a, b))
            if not self.uniform:
                _, _, local_mask, kv_start = self._local(p.positions, last, p.cache.length, mask)
                local_segments.append((p.cache, local_mask, kv_start, a, b))
        full = (cos[None, None], sin[None, None], full_segments)
        if not self.uniform:
            lcos, lsin = self.local_rope(positions, max(lasts), self.dtype)
            local = (lcos[None, None], lsin[None, None], local_segments)
        wanted = set().union(*(p.hidden_layers for p in passes))
        x = self.embed_tokens(input_ids)[None]
        hidden = {0: x[0]} if 0 in wanted else {}
        for i, layer in enumerate(self.layers):
            layer_cos, layer_sin, segments = local if i in self.sliding else full
            x = layer.forward_packed(x, layer_cos, layer_sin, i, segments)
            if i + 1 in wanted and i + 1 < len(self.layers):
                hidden[i + 1] = x[0]
        x = self.norm(x)[0]
        if len(self.layers) in wanted:
            hidden[len(self.layers)] = x
        rows = [x[a:b] if p.logits_rows is None else x[a:b][p.logits_rows] for p, (a, b) in zip(passes, bounds)]
        logits = self.project(torch.cat(rows)).float().split([r.shape[0] for r in rows])
        return [ForwardOutput(logits=lg, hidden={layer: hidden[layer][a:b] for layer in p.hidden_layers})
                for p, (a, b), lg in zip(passes, bounds, logits)]

    def _local(self, positions: torch.Tensor, last: int, prefix: int, mask: torch.Tensor | None) -> tuple:
        """Sliding layers' (cos, sin, mask, kv_start) for `forward`: the full mask narrowed to the window."""
        cos, sin = self.local_rope(positions, last, self.dtype)
        window = self.config.sliding_window
        if not self.sliding or last < window:  # no key can be out of any query's window yet
            return cos[None, None], sin[None, None], mask, 0
        # Slots before kv_start are out of every query's window: committed slot i holds position i and the
        # new tokens sit at positions >= the first of them.
        kv_start = max(0, min(prefix, int(positions.min()) - window + 1))
        if mask is None:  # one token after the prefix: the slots from kv_start on are exactly its window
            return cos[None, None], sin[None, None], None, kv_start
        keys = torch.cat([torch.arange(kv_start, prefix, device=positions.device), positions])
        in_window = keys[None, :] > positions[:, None] - window  # [T, S - kv_start]
        return cos[None, None], sin[None, None], mask[..., kv_start:] & in_window, kv_start

    def forward_sequences(
        self, input_ids: torch.Tensor, hidden_layers: tuple[int, ...] = (), with_logits: bool = True
    ) -> ForwardOutput:
        """Full causal forward over a batch [B, T] without a cache (training, feature extraction).

        Returns logits [B, T, V] (model dtype, for autograd) and hidden states [B, T, H].
        Right padding is harmless: causal attention never lets a real token see a pad after it.
        """
        T = input_ids.shape[1]
        positions = torch.arange(T, device=input_ids.device)
        cos, sin = self.rope(positions, T - 1, self.dtype)
        full = (cos[None, None], sin[None, None], None, 0)

        def local():
            lcos, lsin = self.local_rope(positions, T - 1, self.dtype)
            window = self.config.sliding_window
            mask = None
            if self.sliding and T > window:
                mask = causal_mask(T, input_ids.device) & (positions[None, :] > positions[:, None] - window)
            return lcos[None, None], lsin[None, None], mask, 0

        x, hidden = self._run(self.embed_tokens(input_ids), self._plan(full, local), None, hidden_layers, squeeze=False)
        return ForwardOutput(logits=self.project(x) if with_logits else None, hidden=hidden)

    def _attention_mask(self, T: int, prefix: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        if tree_mask is None:
            if T == 1:
                return None
            tree_mask = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        visible = torch.ones(T, prefix + T - tree_mask.shape[1], dtype=torch.bool, device=self.device)
        return torch.cat([visible, tree_mask.to(self.device)], dim=1)[None, None]

    def load_hf_state_dict(self, state, skip: frozenset[str] = frozenset()) -> None:
        """Load weights named as in transformers' checkpoints of the supported families, fusing projections.

        q/k/v and gate/up are fused here (Phi-3 checkpoints store them fused already). Gemma 2 / 3 name their
        norms by position: post_attention_layernorm (on the attention output) is our attn_output_norm,
        pre_feedforward_layernorm our post_attention_layernorm (the MLP's input norm), post_feedforward_layernorm
        our mlp_output_norm. state: a dict, or runtime/loading.LazyState (read as taken). skip: projection weights (our
        names) not to read, left uninitialised for layers about to be replaced.
        """
        c = self.config
        own: dict[str, torch.Tensor] = {}

        def take(name: str) -> torch.Tensor:
            try:
                return state.pop(name)
            except KeyError:
                raise KeyError(f"checkpoint lacks tensor {name!r}") from None

        def fused(name: str, parts: list[str]) -> torch.Tensor:
            return take(name) if name in state else torch.cat([take(p) for p in parts], dim=0)

        forget = getattr(state, "forget", lambda name: state.pop(name, None))  # drop a tensor unread

        def projection(ours: str, name: str, parts: list[str] | None = None) -> None:
            if ours not in skip:
                own[ours] = take(name) if parts is None else fused(name, parts)
                return
            for n in [name] if parts is None or name in state else parts:
                if n not in state:
                    raise KeyError(f"checkpoint lacks tensor {n!r}")
                forget(n)

        own["embed_tokens.weight"] = take("model.embed_tokens.weight")
        own["norm.weight"] = take("model.norm.weight")
        if c.tie_word_embeddings or "lm_head.weight" in skip:
            forget("lm_head.weight")
        else:
            own["lm_head.weight"] = state.pop("lm_head.weight", own["embed_tokens.weight"])
        for i in range(c.num_hidden_layers):
            p, ours = f"model.layers.{i}.", f"layers.{i}."
            attn, mlp = p + "self_attn.", p + "mlp."
            projection(ours + "qkv_proj.weight", attn + "qkv_proj.weight", [attn + f"{n}_proj.weight" for n in "qkv"])
            if c.attention_bias:
                own[ours + "qkv_proj.bias"] = fused(attn + "qkv_proj.bias", [attn + f"{n}_proj.bias" for n in "qkv"])
            projection(ours + "o_proj.weight", attn + "o_proj.weight")
            if c.o_proj_bias:
                own[ours + "o_proj.bias"] = take(attn + "o_proj.bias")
            if c.qk_norm:
                own[ours + "q_norm.weight"] = take(attn + "q_norm.weight")
                own[ours + "k_norm.weight"] = take(attn + "k_norm.weight")
            projection(ours + "gate_up_proj.weight", mlp + "gate_up_proj.weight",
                       [mlp + "gate_proj.weight", mlp + "up_proj.weight"])
            projection(ours + "down_proj.weight", mlp + "down_proj.weight")
            if c.mlp_bias:
                own[ours + "gate_up_proj.bias"] = fused(mlp + "gate_up_proj.bias", [mlp + "gate_proj.bias", mlp + "up_proj.bias"])
                own[ours + "down_proj.bias"] = take(mlp + "down_proj.bias")
            own[ours + "input_layernorm.weight"] = take(p + "input_layernorm.weight")
            if c.sandwich_norms:
                own[ours + "attn_output_norm.weight"] = take(p + "post_attention_layernorm.weight")
                own[ours + "post_attention_layernorm.weight"] = take(p + "pre_feedforward_layernorm.weight")
                own[ours + "mlp_output_norm.weight"] = take(p + "post_feedforward_layernorm.weight")
            else:
                own[ours + "post_attention_layernorm.weight"] = take(p + "post_attention_layernorm.weight")
        leftovers = [k for k in state if "rotary_emb" not in k]
        if leftovers:
            raise KeyError(f"unexpected tensors in checkpoint: {leftovers[:5]}")
        missing, unexpected = self.load_state_dict(own, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and c.tie_word_embeddings) and m not in skip]
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
