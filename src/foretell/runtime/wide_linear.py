"""bf16 weights whose wide passes run in fp32, for CPUs without a native bf16 matrix multiply.

On a CPU with AVX512-BF16 or AMX, PyTorch's bf16 matmul is fast at any number of rows. On one
without (AVX2 only: many cloud and desktop CPUs), a one-row bf16 product still has a fast path
(half the bytes of fp32), but a product of several rows is emulated and grows linearly with the
rows: measured on such a machine (2 cores), 30 SmolLM2-sized MLP pairs took 7 ms at one row in
bf16 against 21 ms in fp32, but 87 ms at 16 rows against 35 ms, and 353 ms at 64 rows against
62 ms. Verifying a draft tree is a pass of many rows, so there speculation paid less than it cost.

WideLinear keeps the bf16 weight for passes of few rows and an fp32 copy of it (bf16 -> fp32 is
exact) for passes of `wide_rows` rows or more, whose output is rounded back to bf16. Between the
two, passes of 2..`kernel_rows` rows run foretell's own kernel (kernels/bf16_gemm.cpp): it streams
the bf16 weight once and widens it in registers, so a verification pass of 8-16 rows costs about
1.5-2x a one-row pass instead of 3-5x (measured on a 2-core AVX2 machine: 36 SmolLM2-sized
matrices, 7.4 ms at 1 row, 10.3 ms at 8 and 13.7 ms at 16, against 24 ms in fp32 and 32 / 64 ms
emulated). All products accumulate in fp32, so they agree up to summation order, as bf16 passes
of different widths already do. The thresholds are measured once per process (`fp32_wide_rows`,
`kernel_rows`); None means bf16 is as fast as fp32 everywhere (native bf16), and nothing is
replaced. The copy costs 4 bytes more per weight: ~0.5 GB for SmolLM2-135M. fp32 and other dtypes
are untouched, so fp32 exactness tests do not see this.

The mirror case, Bf16ProductLinear: on a CPU with native bf16 products a bf16 target runs as float32 activations in
the lean step (lean_step.run_bf16_as_float32), and its passes of many rows multiply in bf16 on a bf16 copy.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from foretell.kernels import bf16_small_gemm
from foretell.layer_rows import dense_rows

PROBE_ROWS = (2, 4, 6, 8, 12, 16, 32)
PROBE_SHAPE = (1536, 576)  # out, in: SmolLM2-135M's MLP projection, a typical small-model matrix
PROBE_MATRICES = 12  # 21 MB of bf16 weights, 42 MB as fp32


class WideLinear(nn.Linear):
    """An nn.Linear (same weight and bias objects, so ties hold) that runs passes of >= wide_rows rows in fp32."""

    def __init__(self, linear: nn.Linear, wide_rows: int, kernel_rows: int = 0):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.wide_rows = wide_rows
        self.kernel_rows = kernel_rows  # passes of 2..kernel_rows rows run bf16_small_gemm (0: none)
        self.register_buffer("weight_fp32", linear.weight.detach().float(), persistent=False)
        self.register_buffer("bias_fp32", None if linear.bias is None else linear.bias.detach().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if 2 <= rows <= self.kernel_rows and not torch.is_grad_enabled():  # the kernel has no backward
            y = bf16_small_gemm()(x.reshape(rows, -1).float(), self.weight)
            if self.bias_fp32 is not None:
                y += self.bias_fp32
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        if rows < self.wide_rows:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x.float(), self.weight_fp32, self.bias_fp32).to(x.dtype)

    def select_rows(self, rows: torch.Tensor) -> WideLinear:
        """The layer restricted to some output rows (a hot output layer of a few rows), keeping the wide-pass paths."""
        return WideLinear(dense_rows(self, rows), self.wide_rows, self.kernel_rows).requires_grad_(False)


def _seconds(fn, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _paired_seconds(a, b, repeats: int = 5) -> tuple[float, float]:
    """The best times of a and b, timed in turn: a burst of load from another process slows both alike, where
    timing one after the other let it decide the comparison (a feature pass probed while a benchmark ran came out
    unwidened and 5x slower)."""
    a(), b()
    best_a = best_b = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a()
        middle = time.perf_counter()
        b()
        best_a, best_b = min(best_a, middle - start), min(best_b, time.perf_counter() - middle)
    return best_a, best_b


@functools.cache
def fp32_wide_rows(threads: int) -> int | None:
    """The fewest rows from which an fp32 product of a bf16 weight clearly beats the bf16 product on this CPU, or
    None where bf16 is native (at 32 rows the emulated bf16 product takes over twice fp32's time; a native one
    does not). Measured in ~1 s over PROBE_MATRICES matrices, more than a cache holds, as a model's layers stream
    through memory; the crossing needs two probed widths in a row, so one noisy timing does not move it."""
    weights = [torch.randn(PROBE_SHAPE, dtype=torch.bfloat16) for _ in range(PROBE_MATRICES)]
    weights_fp32 = [w.float() for w in weights]
    ratio = []
    for rows in PROBE_ROWS:
        x = torch.randn(rows, PROBE_SHAPE[1], dtype=torch.bfloat16)
        bf16, fp32 = _paired_seconds(lambda: [F.linear(x, w) for w in weights],
                                     lambda: [F.linear(x.float(), w).to(torch.bfloat16) for w in weights_fp32])
        ratio.append(fp32 / bf16)
    if ratio[-1] > 0.5:
        return None
    for i, rows in enumerate(PROBE_ROWS[:-1]):
        if ratio[i] < 0.9 and ratio[i + 1] < 0.9:
            return rows
    return PROBE_ROWS[-1]


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively: AVX512-BF16 or AMX-BF16 among /proc/cpuinfo's flags (a fact, where
    fp32_wide_rows is a timing that a busy machine can sway); where the flags cannot be read, fp32_wide_rows says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return bool({"avx512_bf16", "amx_bf16"} & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return fp32_wide_rows(torch.get_num_threads()) is None


@functools.cache
def kernel_rows(threads: int) -> int:
    """The most rows up to which bf16_small_gemm beats both the bf16 and the fp32 product at every probed width
    on this CPU (0: it never does, or cannot be built here). Measured once in ~1 s, like fp32_wide_rows."""
    gemm = bf16_small_gemm()
    if gemm is None:
        return 0
    weights = [torch.randn(PROBE_SHAPE, dtype=torch.bfloat16) for _ in range(PROBE_MATRICES)]
    weights_fp32 = [w.float() for w in weights]
    best = 0
    for rows in PROBE_ROWS:
        x = torch.randn(rows, PROBE_SHAPE[1])
        xb = x.to(torch.bfloat16)
        kernel = _seconds(lambda: [gemm(x, w) for w in weights])
        others = min(_seconds(lambda: [F.linear(xb, w) for w in weights]),
                     _seconds(lambda: [F.linear(x, w) for w in weights_fp32]))
        if kernel >= others:
            break
        best = rows
    return best


def widen_linears(model: nn.Module, wide_rows: int | None = None, kernel: int | None = None) -> int | None:
    """Make every bf16 nn.Linear of a CPU `model` a WideLinear (in place) where fp32 wide passes pay here; returns
    the fp32 threshold used (None: nothing changed). wide_rows, kernel (kernel_rows): force them (tests, A/B runs)
    instead of measuring."""
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu" or params[0].dtype != torch.bfloat16:
        return None
    wide_rows = wide_rows if wide_rows is not None else fp32_wide_rows(torch.get_num_threads())
    if wide_rows is None:
        return None
    kernel = kernel if kernel is not None else kernel_rows(torch.get_num_threads())
    if kernel and bf16_small_gemm() is None:
        kernel = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16:
                setattr(parent, name, WideLinear(child, wide_rows, kernel))
    for layer in model.modules():
        if hasattr(layer, "attention_fp32"):  # a DecoderLayer: its attention over the cache in fp32 too
            layer.attention_fp32 = True
    return wide_rows


class Bf16ProductLinear(nn.Linear):
    """A float32 nn.Linear whose weight holds bf16 numbers (a bf16 target run as float32 activations over its bf16
    weights, lean_step.run_bf16_as_float32) on a CPU that multiplies bf16 natively: its passes of `bf16_rows` rows
    or more (prompts, batched steps) multiply in bf16 on a bf16 copy of the weight (2 bytes more a weight), as the
    bf16 model did. There AMX / AVX512-BF16 make them ~2x faster than fp32 (a 512-token prompt of SmolLM2-135M: 301
    against 570 ms on a 2-core AMX CPU, docs/speed.md), while the lean step, which takes passes of up
    to 32 rows, keeps fp32 activations. Same weight and bias objects, so ties hold and the lean step packs them."""

    def __init__(self, linear: nn.Linear, bf16_rows: int):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.bf16_rows = bf16_rows
        self.register_buffer("weight_bf16", linear.weight.detach().bfloat16(), persistent=False)
        self.register_buffer("bias_bf16", None if linear.bias is None else linear.bias.detach().bfloat16(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows < self.bf16_rows or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        return F.linear(x.bfloat16(), self.weight_bf16, self.bias_bf16).to(x.dtype)


# Passes of this many rows or more multiply in bf16 where bf16 is native. A fixed count, not a timing: which products
# a prompt gets decides its numbers, and so (at a near-tie) the text, which must not vary from process to process.
# Probed on a 2-core AMX CPU, bf16 products beat fp32 ones from 6-8 rows.
BF16_PRODUCT_ROWS = 8


def bf16_wide_products(model: nn.Module, bf16_rows: int | None = None) -> int | None:
    """Make every float32 nn.Linear of a CPU `model` whose weight holds bf16 numbers a Bf16ProductLinear (in place)
    where this CPU multiplies bf16 natively; returns the row threshold (None: nothing changed). bf16_rows: force it
    (tests), also where bf16 is not native."""
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu" or params[0].dtype != torch.float32:
        return None
    if bf16_rows is None:
        if not native_bf16():
            return None
        bf16_rows = BF16_PRODUCT_ROWS
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            w = getattr(child, "weight", None)
            if type(child) is nn.Linear and w.dtype == torch.float32 and torch.equal(w, w.bfloat16().float()):
                setattr(parent, name, Bf16ProductLinear(child, bf16_rows))
    return bf16_rows


def bf16_rows_of(model: nn.Module) -> int:
    """The model's Bf16ProductLinear threshold, 0 if it has none (a cost curve key)."""
    return next((m.bf16_rows for m in model.modules() if isinstance(m, Bf16ProductLinear)), 0)


def wide_rows_of(model: nn.Module) -> int:
    """The model's WideLinear threshold, 0 if it has none (a cost curve key: the curve differs)."""
    return next((m.wide_rows for m in model.modules() if isinstance(m, WideLinear)), 0)


def kernel_rows_of(model: nn.Module) -> int:
    """The model's bf16-kernel row limit, 0 if it has none (a cost curve key too)."""
    return next((m.kernel_rows for m in model.modules() if isinstance(m, WideLinear)), 0)
