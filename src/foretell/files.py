"""File modes of what foretell writes for others to read (drafters, exported heads, trained models)."""

from __future__ import annotations

import os
from pathlib import Path


def readable_as_umask_allows(folder: Path) -> Path:
    """Give every file of a written folder the mode any new file gets here (0644 under umask 022): safetensors
    writes its files 0600 whatever the umask, which an engine running as another user cannot read. Call it on a
    folder before it is renamed into place, or on one written whole, so no reader sees a half-changed folder."""
    mode = 0o666 & ~current_umask()
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)
    return Path(folder)


def current_umask() -> int:
    try:  # Linux states it; elsewhere reading it means setting it, briefly
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
