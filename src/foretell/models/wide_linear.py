"""Moved to foretell.runtime.wide_linear (the runtime layer); this path is kept for existing imports.
Code that replaces a name for a test (monkeypatch) patches foretell.runtime.wide_linear, where the name is read."""

from foretell.runtime.wide_linear import *  # noqa: F401,F403
