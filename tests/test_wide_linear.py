"""bf16 wide passes in fp32 (runtime/wide_linear.py): same weights and ties, same greedy text in fp32 activations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import PROMPTS, greedy_params
from foretell.api import load
from foretell.runtime.loading import build_model
from foretell.runtime.wide_linear import WideLinear, fp32_wide_rows, wide_rows_of, widen_linears
from foretell.sizing.cost import machine_key


def test_wide_linear_runs_narrow_passes_in_bf16_and_wide_ones_in_fp32():
    torch.manual_seed(0)
    dense = nn.Linear(32, 48, bias=True).to(torch.bfloat16)
    wide = WideLinear(dense, wide_rows=4)
    assert wide.weight is dense.weight and wide.bias is dense.bias
    narrow = torch.randn(3, 32, dtype=torch.bfloat16)
    assert torch.equal(wide(narrow), dense(narrow))  # below the threshold: the bf16 product itself
    many = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    out = wide(many)
    exact = (many.double() @ dense.weight.double().T + dense.bias.double()).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 5, 48)
    # fp32 accumulation of exact bf16 products: within one bf16 rounding of the exact result
    torch.testing.assert_close(out.float(), exact.float(), rtol=1e-2, atol=1e-2)
    assert set(dict(wide.state_dict())) == {"weight", "bias"}  # the fp32 copy is not saved


def test_widen_keeps_ties_and_touches_only_bf16_cpu_linears(tiny_pair):
    model = build_model(tiny_pair[0], torch.bfloat16)
    tied = model.lm_head.weight is model.embed_tokens.weight
    assert widen_linears(model, wide_rows=4) == 4
    assert isinstance(model.lm_head, WideLinear) and wide_rows_of(model) == 4
    assert (model.lm_head.weight is model.embed_tokens.weight) == tied
    assert all(type(m) is not nn.Linear for m in model.modules())
    assert all(layer.attention_fp32 for layer in model.layers)  # its attention over the cache too
    fp32 = build_model(tiny_pair[0], torch.float32)
    assert widen_linears(fp32, wide_rows=4) is None and wide_rows_of(fp32) == 0
    assert not any(layer.attention_fp32 for layer in fp32.layers)
    assert machine_key(model, "tiny")["wide_rows"] == 4 and machine_key(fp32, "tiny")["wide_rows"] == 0


def test_the_measured_threshold_is_a_probed_width_or_none():
    assert fp32_wide_rows(torch.get_num_threads()) in (None, 2, 4, 6, 8, 12, 16, 32)


def test_bf16_target_with_wide_passes_keeps_its_plain_greedy_output_under_speculation(tiny_pair):
    """Wide passes change only the summation order: on the tiny target, prompt lookup (verification passes of
    several rows, in fp32 here) gives the widened bf16 target's plain greedy output (one-row passes, bf16)."""
    plain = load(tiny_pair[0], "none", dtype="bfloat16", wide_fp32=False, warm_up=False)
    assert widen_linears(plain.target.model, wide_rows=2) == 2  # whatever this CPU measures
    lookup = plain.with_speculative("prompt-lookup")
    for prompt in PROMPTS:
        want = plain.engine.generate(prompt, greedy_params(24)).tokens
        assert lookup.engine.generate(prompt, greedy_params(24)).tokens == want


def test_training_in_bf16_on_an_emulated_bf16_cpu_is_warned_about(monkeypatch, capsys):
    from argparse import Namespace

    from foretell.runtime import wide_linear
    from foretell.train.common.options import warn_emulated_bf16

    args = Namespace(bf16=True, feature_dtype="bfloat16", device="cpu")
    monkeypatch.setattr(wide_linear, "fp32_wide_rows", lambda threads: 8)
    warn_emulated_bf16(args)
    err = capsys.readouterr().err
    assert "no native bf16" in err and "--bf16" in err
    warn_emulated_bf16(Namespace(bf16=False, feature_dtype="bfloat16", device="cpu"))  # extraction is widened
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(wide_linear, "fp32_wide_rows", lambda threads: None)  # native bf16: nothing to say
    warn_emulated_bf16(args)
    assert capsys.readouterr().err == ""


def test_int8_prefill_runs_in_fp32_where_bf16_is_emulated(monkeypatch):
    from foretell.runtime import wide_linear
    from foretell.runtime.quant import FUSED_MAX_ROWS, Int8Linear

    torch.manual_seed(0)
    layer = Int8Linear.from_weight(torch.randn(24, 16).to(torch.bfloat16))
    x = torch.randn(FUSED_MAX_ROWS + 8, 16, dtype=torch.bfloat16)  # past the fused kernel: the dense path
    reference = (x.double() @ (layer.weight_int8.double() * layer.scale.double()[:, None]).T)
    for rows in (None, 8):  # native bf16, then emulated (fp32 product)
        monkeypatch.setattr(wide_linear, "fp32_wide_rows", lambda threads, rows=rows: rows)
        out = layer(x)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.double(), reference, rtol=2e-2, atol=2e-2)


def test_a_bf16_feature_pass_runs_its_wide_products_in_fp32(tiny_pair, monkeypatch, tmp_path):
    """--feature-dtype bfloat16 on a CPU without native bf16: the feature pass's extractor is widened (its 320-row
    passes were ~7x slower emulated), and its features are the bf16 target's up to summation order."""
    from types import SimpleNamespace

    from foretell.runtime import wide_linear
    from foretell.train.common import feature_run
    from foretell.train.common.data import DataConfig
    from foretell.train.common.features import FeatureConfig, extract_batch

    monkeypatch.setattr(wide_linear, "fp32_wide_rows", lambda threads: 4)
    used = {}
    monkeypatch.setattr(feature_run, "build_feature_cache", lambda extractor, *args: used.setdefault("model", extractor))
    target = build_model(tiny_pair[0], torch.float32)
    cfg = SimpleNamespace(out=tmp_path, data=DataConfig("unused", seq_len=16),
                          features=FeatureConfig(top_k=4, dtype="bfloat16"))
    ids = torch.randint(0, target.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    feature_run.prepare_features(cfg, tiny_pair[0], target, SimpleNamespace(input_ids=ids), (1,))
    assert used["model"].dtype == torch.bfloat16 and wide_rows_of(used["model"]) == 4
    wide, emulated = extract_batch(used["model"], ids, (1,), 4), extract_batch(
        build_model(tiny_pair[0], torch.bfloat16), ids, (1,), 4)
    torch.testing.assert_close(wide[0].float(), emulated[0].float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(wide[1], emulated[1], rtol=2e-2, atol=2e-2)


def _kernel_or_skip():
    import pytest

    from foretell.kernels import bf16_small_gemm

    gemm = bf16_small_gemm()
    if gemm is None:
        pytest.skip("foretell's bf16 kernel is not available here (not x86 with AVX2, or no C++ compiler / ninja)")
    return gemm


def test_the_bf16_kernel_is_an_fp32_product_of_the_bf16_weight():
    """Odd shapes too: a K not a multiple of 8 (the scalar tail), an odd N (the last single column), 1-33 rows."""
    gemm = _kernel_or_skip()
    g = torch.Generator().manual_seed(0)
    for rows, k, n in [(1, 16, 3), (2, 13, 5), (5, 64, 7), (7, 576, 96), (33, 100, 9), (3, 7, 1)]:
        x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g).to(torch.bfloat16)
        exact = x.double() @ w.double().T
        torch.testing.assert_close(gemm(x, w).double(), exact, rtol=1e-4, atol=1e-4)  # fp32 sums of <= 576 terms


def test_wide_linear_runs_its_middle_widths_in_the_kernel(monkeypatch):
    from foretell.runtime import wide_linear

    gemm = _kernel_or_skip()
    calls = []
    monkeypatch.setattr(wide_linear, "bf16_small_gemm", lambda: lambda x, w: calls.append(len(x)) or gemm(x, w))
    torch.manual_seed(0)
    dense = nn.Linear(40, 24, bias=True).to(torch.bfloat16)
    wide = WideLinear(dense, wide_rows=12, kernel_rows=8)
    with torch.no_grad():
        for shape in [(1, 40), (2, 3, 40), (8, 40), (9, 40), (12, 40)]:
            x = torch.randn(shape, dtype=torch.bfloat16)
            exact = (x.double() @ dense.weight.double().T + dense.bias.double()).to(torch.bfloat16)
            out = wide(x)
            assert out.shape == (*shape[:-1], 24) and out.dtype == torch.bfloat16
            torch.testing.assert_close(out.float(), exact.float(), rtol=1e-2, atol=1e-2)
    assert calls == [6, 8]  # 1 row: bf16; 9 rows: bf16 (below wide_rows); 12: fp32
    wide(torch.randn(4, 40, dtype=torch.bfloat16))  # grad enabled: the kernel has no backward
    assert calls == [6, 8]


def test_bf16_target_with_the_kernel_keeps_its_plain_greedy_output_under_speculation(tiny_pair):
    _kernel_or_skip()
    plain = load(tiny_pair[0], "none", dtype="bfloat16", wide_fp32=False, warm_up=False)
    assert widen_linears(plain.target.model, wide_rows=32, kernel=16) == 32
    assert machine_key(plain.target.model, "tiny")["kernel_rows"] == 16
    lookup = plain.with_speculative("prompt-lookup")
    for prompt in PROMPTS:
        want = plain.engine.generate(prompt, greedy_params(24)).tokens
        assert lookup.engine.generate(prompt, greedy_params(24)).tokens == want


def test_no_kernels_when_turned_off(monkeypatch):
    from foretell import kernels

    monkeypatch.setenv("FORETELL_NO_KERNELS", "1")
    assert kernels.bf16_small_gemm.__wrapped__() is None


def test_a_kernel_build_killed_midway_leaves_no_lock_that_hangs_the_next():
    """torch's build lock file outlives a process killed mid-build; the next foretell process clears it (holding
    its own OS lock, so no build is running) instead of waiting on it forever."""
    import subprocess
    import sys

    from foretell import kernels

    if not kernels.kernels_allowed():
        pytest.skip("foretell's kernels are not built on this CPU")
    folder, _ = kernels.build_folder("bf16_gemm")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lock").touch()  # what a killed build leaves
    probe = "from foretell import kernels; print(kernels.bf16_small_gemm() is not None)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert done.stdout.strip() == "True", done.stderr
    assert "left by an interrupted kernel build" in done.stderr and not (folder / "lock").exists()


def test_auto_draft_quant_keeps_bf16_drafts_where_the_kernel_runs(monkeypatch):
    """On a CPU without native bf16 but with foretell's kernel, bf16 drafts stay bf16 ("auto" = none): the kernel
    beat PyTorch's int8 kernel there. Elsewhere on CPU "auto" is int8 (fp32 drafts: where foretell's block kernel
    runs them), and none off the CPU."""
    from foretell.kernels import block_gemm
    from foretell.runtime import wide_linear
    from foretell.runtime.quant import resolve_quant

    monkeypatch.setattr(wide_linear, "fp32_wide_rows", lambda threads: 8)
    monkeypatch.setattr(wide_linear, "kernel_rows", lambda threads: 32)
    assert resolve_quant("auto", "cpu", torch.bfloat16) == "none"
    assert resolve_quant("auto", "cpu", torch.float32) == ("none" if block_gemm() is None else "int8")
    assert resolve_quant("int8", "cpu", torch.bfloat16) == "int8"
    monkeypatch.setattr(wide_linear, "kernel_rows", lambda threads: 0)  # no kernel built here
    assert resolve_quant("auto", "cpu", torch.bfloat16) == "int8"
    monkeypatch.setattr(wide_linear, "fp32_wide_rows", lambda threads: None)  # native bf16
    monkeypatch.setattr(wide_linear, "kernel_rows", lambda threads: 32)
    assert resolve_quant("auto", "cpu", torch.bfloat16) == "int8"
    assert resolve_quant("auto", "meta", torch.bfloat16) == "none"


def test_a_hot_cut_of_a_wide_layer_stays_wide():
    from foretell.layer_rows import select_rows

    torch.manual_seed(0)
    wide = WideLinear(nn.Linear(24, 40, bias=False).to(torch.bfloat16), wide_rows=12, kernel_rows=8)
    rows = torch.tensor([1, 5, 39])
    cut = select_rows(wide, rows)
    assert isinstance(cut, WideLinear) and (cut.wide_rows, cut.kernel_rows) == (12, 8)
    assert torch.equal(cut.weight, wide.weight[rows]) and not cut.weight.requires_grad
    x = torch.randn(16, 24, dtype=torch.bfloat16)
    torch.testing.assert_close(cut(x).float(), wide(x)[:, rows].float(), rtol=1e-2, atol=1e-2)


def test_a_bf16_head_loaded_for_a_bf16_target_takes_the_wide_paths(tiny_pair, tmp_path, monkeypatch):
    """Drafter modules loaded through the configuration are widened like the target: a tree level of a few rows
    runs the kernel, not the emulated bf16 product; its greedy output stays the target's."""
    from foretell.config import SpeculativeConfig
    from foretell.drafters.eagle_tree import Eagle3Drafter
    from foretell.models.eagle3 import Eagle3Config, new_eagle3_head, save_eagle3_head

    from foretell.runtime import wide_linear

    monkeypatch.setattr(wide_linear, "fp32_wide_rows", lambda threads: 16)
    monkeypatch.setattr(wide_linear, "kernel_rows", lambda threads: 0)  # no kernel: "auto" makes it int8, fc stays
    target = build_model(tiny_pair[0], torch.float32)
    head = new_eagle3_head(target, Eagle3Config.for_target(target.config, draft_vocab_size=40), seed=1)
    save_eagle3_head(head, tmp_path / "head")
    spec = SpeculativeConfig(method="eagle3", model=str(tmp_path / "head"), draft_quant="auto")
    pipe = load(tiny_pair[0], spec, dtype="bfloat16", lean=False, warm_up=False)  # lean: float32 (test_lean_bf16)
    drafter = pipe.engine.drafter
    assert isinstance(drafter, Eagle3Drafter) and wide_rows_of(drafter.head) == 16
    plain = pipe.with_speculative("none")
    for prompt in PROMPTS:
        assert pipe.engine.generate(prompt, greedy_params(16)).tokens == plain.engine.generate(prompt, greedy_params(16)).tokens


def test_foretell_cost_says_which_products_the_wide_passes_use(tiny_pair, tmp_path, monkeypatch, capsys):
    from foretell.cli import main
    from foretell.runtime import wide_linear

    monkeypatch.setenv("FORETELL_CACHE", str(tmp_path / "cache"))  # a fresh cost curve, not a cached one
    from foretell.runtime import lean_step

    monkeypatch.setattr(lean_step, "run_bf16_as_float32", lambda model: False)  # as for a target the lean step
    # does not suit: it stays bf16 (else bf16 runs as float32, test_lean_bf16)
    monkeypatch.setattr(wide_linear, "fp32_wide_rows", lambda threads: 12)
    monkeypatch.setattr(wide_linear, "kernel_rows", lambda threads: 0)
    assert main(["cost", str(tiny_pair[0]), "--dtype", "bfloat16", "--plot", str(tmp_path / "c.png")]) == 0
    assert "(fp32 from 12 rows)" in capsys.readouterr().out
    monkeypatch.setattr(wide_linear, "kernel_rows", lambda threads: 8)
    monkeypatch.setattr(wide_linear, "bf16_small_gemm", lambda: lambda x, w: x @ w.float().T)  # the kernel's product
    assert main(["cost", str(tiny_pair[0]), "--dtype", "bfloat16", "--plot", str(tmp_path / "c.png")]) == 0
    assert "(bf16 kernel for 2..8 rows, fp32 from 12 rows)" in capsys.readouterr().out
    assert main(["cost", str(tiny_pair[0]), "--dtype", "float32", "--plot", str(tmp_path / "d.png")]) == 0
    assert "fp32 from" not in capsys.readouterr().out


def test_a_compiled_bf16_target_with_the_kernel_decodes_like_the_eager_one(tiny_pair):
    """torch.compile (opt-in) traces through the wide paths (the kernel is a graph break, not an error)."""
    _kernel_or_skip()
    eager = load(tiny_pair[0], "none", dtype="bfloat16", wide_fp32=False, warm_up=False)
    compiled = load(tiny_pair[0], "none", dtype="bfloat16", wide_fp32=False, compile=True, warm_up=False)
    for pipe in (eager, compiled):
        widen_linears(pipe.target.model, wide_rows=32, kernel=16)
    lookup = compiled.with_speculative("prompt-lookup")
    for prompt in PROMPTS[:2]:
        want = eager.engine.generate(prompt, greedy_params(12)).tokens
        assert compiled.engine.generate(prompt, greedy_params(12)).tokens == want
        assert lookup.engine.generate(prompt, greedy_params(12)).tokens == want
