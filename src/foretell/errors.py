"""The one exception type users see: its message names the problem and what to do."""


class ForetellError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits non-zero."""
