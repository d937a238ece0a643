"""The cost model: what a target pass costs on this machine by verified tokens (the Sequoia argument, measured).

How much a target pass costs as the number of verified tokens grows depends on the hardware
and dtype: on a CPU in bf16, 8 tokens cost about as much as 1; in fp32 they cost 2x. So the
best draft length / tree size is not a constant. We measure the forward time curve once per
(model, dtype, machine), cache it, and pick the size maximising expected tokens per second:

    rate(n) = expected_tokens(n) / (draft_seconds(n) + verify_seconds(n + 1))

(the one chooser of that, for every sizing policy, is sizing/chooser.best_prefix; the policies are the other
files of sizing/).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
import sys

import torch

from foretell.models.transformer import RUNTIME_VERSION, Transformer
from foretell.runtime.gguf_quant import BlockQ8Linear, GGUFLinear
from foretell.runtime.loading import default_cache_dir
from foretell.runtime.quant import Int4Linear, Int8Linear
from foretell.runtime.wide_linear import bf16_rows_of, kernel_rows_of, wide_rows_of

DEFAULT_SIZES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass
class CostCurve:
    """Median seconds of one forward over n new tokens after a `context`-token prefix."""

    sizes: list[int]
    seconds: list[float]
    context: int
    key: dict = field(default_factory=dict)

    def __call__(self, n: int) -> float:
        """Linear interpolation (and extrapolation from the last two points)."""
        xs, ys = self.sizes, self.seconds
        if n <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        (x0, y0), (x1, y1) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
        return y1 + (y1 - y0) * (n - x1) / (x1 - x0)


@dataclass
class CorrectedCost:
    """A measured CostCurve corrected online by the verification times decoding reports: when another process
    competes for the cores, big passes slow down more than small ones, so the corrected curve steepens and the
    sizes chosen from it shrink. Each correction is a decayed ratio measured / curve at the curve's size nearest
    the pass; a size asked for takes the nearest correction. Copies of a policy share one (what the machine costs
    carries over from request to request)."""

    curve: CostCurve
    decay: float = 0.9
    correction: dict[int, float] = field(default_factory=dict)  # curve size -> decayed measured / curve
    _seconds: dict[int, float] = field(default_factory=dict)  # memo, cleared when a correction moves

    def __call__(self, tokens: int) -> float:
        if tokens not in self._seconds:
            if not self.correction:
                self._seconds[tokens] = self.curve(tokens)
            else:
                nearest = min(self.correction, key=lambda size: (abs(math.log(size / tokens)), size))
                self._seconds[tokens] = self.curve(tokens) * self.correction[nearest]
        return self._seconds[tokens]

    def observe(self, tokens: int, seconds: float) -> None:
        """One verification pass of `tokens` rows took `seconds`."""
        size = min(self.curve.sizes, key=lambda s: abs(math.log(s / tokens)))
        ratio = seconds / self.curve(tokens)
        old = self.correction.get(size)
        self.correction[size] = ratio if old is None else self.decay * old + (1 - self.decay) * ratio
        self._seconds.clear()

    def summary(self) -> dict[int, float]:
        return {k: round(v, 3) for k, v in sorted(self.correction.items())}


def weight_format(model: Transformer) -> str:
    kinds = {type(m) for m in model.modules()}
    if GGUFLinear in kinds or BlockQ8Linear in kinds:
        return "gguf"  # a GGUF file's own blocks (quant="gguf")
    return "int4" if Int4Linear in kinds else "int8" if Int8Linear in kinds else "dense"


def machine_key(model: Transformer, model_name: str) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    device = torch.cuda.get_device_name() if model.device.type == "cuda" else cpu
    return {
        "model": model_name,
        "layers": model.config.num_hidden_layers,
        "hidden": model.config.hidden_size,
        "dtype": str(model.dtype),
        "device": device,
        "threads": torch.get_num_threads(),
        "weights": weight_format(model),
        "compiled": model.compiled,
        "wide_rows": wide_rows_of(model),  # bf16 passes of this many rows or more run in fp32 (runtime/wide_linear.py)
        "kernel_rows": kernel_rows_of(model),  # and of 2..this many rows in foretell's bf16 kernel
        "bf16_rows": bf16_rows_of(model),  # float32 passes of this many rows or more multiply in bf16 (native bf16)
        "lean": model.lean is not None,  # one-token steps in one native call (runtime/lean_step.py)
        "act_q8": model.lean is not None and model.lean.act_q8,  # with 8-bit activations
        "lean_bf16": model.lean is not None and model.lean.streams_bf16,  # dense weights read as bf16
        "lean_amx": model.lean is not None and model.lean.amx,  # bf16 products on AMX tiles
        "runtime": RUNTIME_VERSION,  # a faster forward makes old curves stale
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def measure_cost_curve(
    model: Transformer, sizes=DEFAULT_SIZES, context: int = 256, repeats: int = 5, key: dict | None = None
) -> CostCurve:
    cache = model.new_cache(context + max(sizes))
    device = model.device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (context + max(sizes),), generator=g).to(device)
    model(ids[:context], torch.arange(context, device=device), cache)
    cache.commit_prefix(context)
    # the sizes in turns, round after round (the first warms each shape up), so a burst of load on the machine
    # slows every size alike instead of bending the curve at the sizes it hit
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats + 1):
        for n in sizes:
            positions = torch.arange(context, context + n, device=device)
            _sync(device)
            t = time.perf_counter()
            model(ids[context : context + n], positions, cache)
            _sync(device)
            times[n].append(time.perf_counter() - t)
    seconds = [sorted(times[n][1:])[len(times[n][1:]) // 2] for n in sizes]
    return CostCurve(list(sizes), seconds, context, key or {})


# A cached curve whose one-token pass is this much slower than the machine's now was measured under load (or on a
# slower host of the same name): the scheduler would think wide passes cheap against a step and grow trees too big.
# Slower now is not evidence (load now, which the scheduler's online correction follows), so only this way re-measures.
STALE_FACTOR = 1.3


def _read_curve(path: Path) -> CostCurve | None:
    """The curve cached at `path`; None where there is none or it is damaged (it is simply measured again)."""
    try:
        curve = CostCurve(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return curve if curve.sizes and len(curve.sizes) == len(curve.seconds) else None


def cost_curve(model: Transformer, model_name: str, cache_dir: Path | None = None, **measure) -> CostCurve:
    """The cached curve for this model, dtype and machine, measured on first use and again where a one-token pass
    now runs STALE_FACTOR faster than the cached curve says."""
    key = machine_key(model, model_name)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache_dir or default_cache_dir()) / "costs" / f"{digest}.json"
    cached = _read_curve(path)
    if cached is not None:
        # a short context keeps the check cheap for big models (a 256-token prefill of a 1.5B target takes seconds
        # on a CPU); it makes `now` a little faster, well within STALE_FACTOR
        now = measure_cost_curve(model, sizes=(1,), context=min(cached.context, 32), repeats=3).seconds[0]
        if cached(1) <= STALE_FACTOR * now:
            return cached
        print(f"foretell: the cached cost curve of {model_name} has {cached(1) * 1e3:.1f} ms a one-token pass, this "
              f"machine now {now * 1e3:.1f} ms (it was measured under load); measuring it again", file=sys.stderr)
    else:
        print(f"foretell: measuring the forward cost curve of {model_name} on this machine (once)", file=sys.stderr)
    curve = measure_cost_curve(model, key=key, **measure)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(curve)))
    tmp.replace(path)
    return curve


def plot_cost_curve(curves: dict[str, CostCurve], path: Path) -> None:
    # start-up: matplotlib takes most of a second to import, and only plots use it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, c in curves.items():
        ax.plot(c.sizes, [s * 1000 for s in c.seconds], marker="o", label=name)
    ax.set_xlabel("tokens verified in one forward")
    ax.set_ylabel("forward time (ms)")
    ax.set_title(f"Forward cost vs tokens (context {next(iter(curves.values())).context})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
