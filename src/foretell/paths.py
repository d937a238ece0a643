"""Where foretell keeps what it makes on this machine (converted models, built kernels, cost curves, hot
vocabularies: one folder, FORETELL_CACHE or ~/.cache/foretell), and where it reads the shared data (benchmark
prompts, training text: FORETELL_DATA or shared/data beside the repository)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    return Path(os.environ.get("FORETELL_CACHE", Path.home() / ".cache" / "foretell"))


REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    return Path(os.environ.get("FORETELL_DATA", REPO_ROOT.parent / "shared" / "data"))
