"""Moved to foretell.runtime.quant (the runtime layer); this path is kept for existing imports.
Code that replaces a name for a test (monkeypatch) patches foretell.runtime.quant, where the name is read."""

from foretell.runtime.quant import *  # noqa: F401,F403
