"""scripts/install_llama_cpp.sh's choice of build from the CPU's extensions (PLAN_ONLY=1: nothing is built): on an
AMX CPU it skips the native build, whose AMX int8 kernel dies with SIGILL, and says why; elsewhere it tries native."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "install_llama_cpp.sh"
AVX512 = "fpu sse2 avx avx2 fma f16c bmi2 avx512f avx512vbmi avx512_vnni avx512_bf16"
AMX = AVX512 + " amx_bf16 amx_tile amx_int8"
AVX2 = "fpu sse2 avx avx2 fma f16c bmi2"


def plan(tmp_path: Path, flags: str, **env) -> subprocess.CompletedProcess:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: a test CPU\nflags\t\t: {flags}\n\n")
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PLAN_ONLY": "1", "CPUINFO": str(cpuinfo), **env})


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, timeout=30).returncode == 0


def test_an_amx_cpu_gets_one_avx512_build_and_is_told_why(tmp_path):
    out = plan(tmp_path, AMX)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[:2] == ["build:", "portable"]
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AVX512=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_INT8=OFF",
            "-DGGML_AMX_TILE=OFF"} <= set(lines)
    why = " ".join(out.stderr.split())
    assert "native build is skipped" in why and "tinygemm_kernel_amx" in why and "ARCH_REQ_XCOMP_PERM" in why
    assert "AVX-512 build is the peer" in why


@pytest.mark.parametrize("flags, avx512", [(AVX512, "ON"), (AVX2, "OFF")])
def test_other_cpus_try_the_native_build_first(tmp_path, flags, avx512):
    out = plan(tmp_path, flags)
    assert out.returncode == 0 and out.stdout.split() == ["build:", "native", "-DGGML_NATIVE=ON"]
    assert "skipped" not in out.stderr
    portable = plan(tmp_path, flags, LLAMA_CPP_BUILD="portable").stdout.split()  # what a failed smoke test falls to
    assert portable[:2] == ["build:", "portable"] and f"-DGGML_AVX512={avx512}" in portable


def test_the_native_attempt_can_still_be_asked_for_and_a_bad_choice_is_refused(tmp_path):
    assert plan(tmp_path, AMX, LLAMA_CPP_BUILD="native").stdout.split()[:2] == ["build:", "native"]
    bad = plan(tmp_path, AMX, LLAMA_CPP_BUILD="fast")
    assert bad.returncode == 1 and "LLAMA_CPP_BUILD is auto, native or portable, not 'fast'" in bad.stderr
