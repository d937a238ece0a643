"""The runtime's configuration checks itself when made, and prepare runs its steps in the order it writes down."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from foretell.errors import ForetellError
from foretell.runtime import prepare as prepare_module
from foretell.runtime.config import RuntimeConfig
from foretell.runtime.prepare import drafter_runtime, prepare


def test_a_runtime_config_is_frozen_and_keeps_a_torch_dtype_by_name():
    config = RuntimeConfig(dtype=torch.bfloat16, device="cpu")
    assert config.dtype == "bfloat16" and config.torch_dtype is torch.bfloat16
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lean = False
    assert dataclasses.replace(config, lean=False).lean is False


@pytest.mark.parametrize(("options", "message"), [
    (dict(quant="int3"), "unknown weight format 'int3'"),
    (dict(activations="q4"), "unknown activation format 'q4'"),
    (dict(dtype="float64"), "unknown dtype 'float64'"),
    (dict(quant="int8", gguf_file="model.gguf"), "quant='gguf'"),
    (dict(wide_rows=-1), "wide_rows is a row count"),
    (dict(quant="int4", activations="q8", dtype="bfloat16"), "quant='int4-q8' .* a float32 target on CPU"),
    (dict(quant="gguf", activations="q8", compile=True), "without compile"),
    (dict(quant="int8", activations="q8", lean=False), "with lean=True"),
    (dict(quant="int8", activations="q8", device="cuda"), "on CPU"),
])
def test_a_runtime_config_refuses_what_cannot_run(options, message):
    with pytest.raises(ForetellError, match=message):
        RuntimeConfig(**options)


class Recorder(nn.Module):
    """A drafter-like module that records prepare's calls, and the weight its quantize saw."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.full((4, 4), 1 + 2**-12))  # not a bf16 number
        self.calls = []

    def quantize(self, mode):
        self.calls.append(("quantize", mode, self.proj.weight[0, 0].item()))
        return self

    def use_lean_step(self, act_q8=False):
        self.calls.append(("lean", act_q8))
        return "not here"

    def compile_steps(self):
        self.calls.append(("compile",))


def test_prepare_rounds_then_quantizes_then_picks_compile_or_the_lean_step(monkeypatch):
    # prepare's drafter-module steps (runtime/drafter_modules.py), pointed at the recorder's own
    monkeypatch.setattr(prepare_module, "DrafterModule", Recorder)
    monkeypatch.setattr(prepare_module, "quantize_drafter", lambda module, mode: module.quantize(mode))
    monkeypatch.setattr(prepare_module, "use_lean_step", lambda module, act_q8=False: module.use_lean_step(act_q8))
    module = Recorder()
    done = prepare(module, RuntimeConfig(quant="int8", bf16_numbers=True, bf16_as_float32=False))
    assert done.module is module and not done.bf16_as_float32 and done.wide_rows is None and done.lean == "not here"
    assert module.calls == [("quantize", "int8", 1.0), ("lean", False)]  # quantized the rounded weight
    module = Recorder()
    prepare(module, RuntimeConfig(quant=None, compile=True))
    assert module.calls == [("compile",)]  # quant None: the weights as they are; compile instead of the lean step
    module = Recorder()
    assert prepare(module, RuntimeConfig(quant=None, lean=False)).lean is None and module.calls == []


def test_a_drafter_follows_its_targets_paths():
    target = nn.Linear(2, 2)
    target.lean = None
    config = drafter_runtime(target, "cpu", torch.float32, quant="auto", q8=True)
    assert (config.lean, config.activations, config.bf16_as_float32) == (False, "float", False)
    assert (config.wide_rows, config.kernel_rows, config.bf16_rows) == (0, 0, 0)
    target.lean = type("Lean", (), {"act_q8": True})()
    assert drafter_runtime(target, "cpu", "float32", q8=True).activations == "q8"
    assert drafter_runtime(target, "cpu", "float32", q8=False).activations == "float"


def test_the_pytorch_model_and_the_kernels_know_nothing_of_the_runtime():
    """models/transformer.py is the plain PyTorch model (the fast path is runtime/lean_step.LeanTransformer), and
    kernels/ reads only its cache folder from foretell."""
    from foretell.models.transformer import Transformer
    from foretell.runtime.lean_step import LeanTransformer
    from test_import_cycles import SRC, import_graph

    graph = import_graph(SRC, "foretell")
    assert not {m for m in graph["foretell.models.transformer"] if m.startswith(("foretell.runtime", "foretell.kernels"))}
    assert graph["foretell.kernels"] == {"foretell.paths"}
    assert not hasattr(Transformer, "use_lean_step") and issubclass(LeanTransformer, Transformer)
