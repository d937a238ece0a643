"""Moved to foretell.runtime.lean_step (the runtime layer); this path is kept for existing imports.
Code that replaces a name for a test (monkeypatch) patches foretell.runtime.lean_step, where the name is read."""

from foretell.runtime.lean_step import *  # noqa: F401,F403
