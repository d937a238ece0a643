"""A target forward of a fixed number of new tokens captured as a CUDA graph, to measure what capture buys.

At batch size one a small model's step on a GPU is dominated by kernel launches (hundreds per forward);
replaying a captured graph launches them all at once. The captured graph writes the KV cache slots it was
captured at, so CapturedForward serves cost measurement (benchmarks/gpu/gpu_check.py); decoding through captured
graphs needs cache writes and attention indexed by tensors rather than Python integers (not built yet).
"""

from __future__ import annotations

import torch

from foretell.kv_cache import KVCache
from foretell.models.transformer import ForwardOutput, Transformer


class CapturedForward:
    def __init__(self, model: Transformer, cache: KVCache, num_tokens: int, warmups: int = 3):
        device = model.device
        if device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
        self.positions = torch.arange(cache.length, cache.length + num_tokens, device=device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():  # capture needs warmed-up kernels and allocator
            for _ in range(warmups):
                model(self.ids, self.positions, cache)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.inference_mode():
            self.out: ForwardOutput = model(self.ids, self.positions, cache)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> ForwardOutput:
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        self.graph.replay()
        return self.out
