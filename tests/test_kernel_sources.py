"""The lean kernel's sources: lean_decode.cpp and the headers it includes (kernels/lean/*.h). The build folder's key
covers every one of them, so a change to any header builds the kernel anew, and every header an include names is
one the key (and the package's data) covers. Hashing only: nothing is compiled here."""

from __future__ import annotations

import re
import shutil

import torch

from foretell import kernels


def test_every_include_is_a_source_the_key_covers():
    sources = kernels.source_files("lean_decode")
    assert sources[0].name == "lean_decode.cpp" and len(sources) > 1
    for source in sources:
        for name in re.findall(r'^#include "([^"]+)"', source.read_text(), flags=re.M):
            assert source.parent / name in sources, f"{source.name} includes {name}, which the build key misses"


def test_the_key_changes_with_any_header(tmp_path, monkeypatch):
    folder = tmp_path / "kernels"
    shutil.copytree(kernels.FOLDER, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(kernels, "FOLDER", folder)
    key = kernels.source_key("lean_decode")
    assert kernels.build_folder("lean_decode")[1] == key
    header = sorted((folder / "lean").glob("*.h"))[-1]
    header.write_text(header.read_text() + "// one more line\n")
    changed = kernels.source_key("lean_decode")
    assert changed != key
    (folder / "lean" / "new_kind.h").write_text("#pragma once\n")  # a header added
    assert kernels.source_key("lean_decode") not in (key, changed)


def test_a_kernel_without_headers_keeps_its_key():
    """bf16_gemm.cpp includes no headers of its own: its key is its source's and torch's version, as it was."""
    import hashlib

    cpp = kernels.FOLDER / "bf16_gemm.cpp"
    assert kernels.source_files("bf16_gemm") == [cpp]
    expected = hashlib.sha256(cpp.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    assert kernels.source_key("bf16_gemm") == expected
