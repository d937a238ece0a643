"""Where foretell keeps what it makes on this machine: converted models, built kernels, cost curves, hot
vocabularies. One folder, FORETELL_CACHE or ~/.cache/foretell."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    return Path(os.environ.get("FORETELL_CACHE", Path.home() / ".cache" / "foretell"))
