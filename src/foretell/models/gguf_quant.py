"""Moved to foretell.runtime.gguf_quant (the runtime layer); this path is kept for existing imports.
Code that replaces a name for a test (monkeypatch) patches foretell.runtime.gguf_quant, where the name is read."""

from foretell.runtime.gguf_quant import *  # noqa: F401,F403
