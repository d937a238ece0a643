"""The server's own limits, fixed at start and checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass

from foretell.config import DEFAULT_PREFILL_CHUNK
from foretell.errors import ForetellError


@dataclass(frozen=True)
class ServeSettings:
    """api_key: when set, every /v1 request needs `Authorization: Bearer <api_key>` (else 401).
    max_queue: requests that may wait for the engine; one more is answered 503 with Retry-After.
    request_timeout: seconds from a request's arrival in the queue to its last token, waiting included.
    max_body_bytes: the largest request body read (else 413).
    retry_after: the Retry-After seconds sent with a 503 when the queue is full.
    max_batch: requests decoded together (one target pass verifies all their drafts); 1 = one at a time.
    batch_budget: how many draft tokens each request of a batch may have verified per pass: auto (foretell's
        batch-aware budget, from this machine's measured cost curve), fixed (by batch size, as vLLM
        configures it) or none (each drafter as configured).
    prefill_chunk: prompt tokens read per pass, so a long prompt never stalls the requests already running.
    prefix_cache_mb: MiB of prompt prefixes kept for later requests that start with them (prefix_cache.py); 0 = off.
    shutdown_timeout: on SIGTERM, seconds the requests in flight may take to finish; past it each still running is
        ended with an error (a 503, or an error event and [DONE] in a stream).
    header_timeout: seconds a connection may take to send a request's line and headers, counted from its opening
        or from the end of its previous response; past it the connection is closed (a client that never
        finishes its headers holds no connection for long).
    body_timeout: seconds a request's body may take to arrive whole once the route reads it; past it the request is
        answered 408 and its connection closed (a client that trickles its body holds no connection for long).
    keep_alive_timeout: seconds an idle connection is kept open between requests.
    """

    api_key: str | None = None
    max_queue: int = 32
    request_timeout: float = 600.0
    max_body_bytes: int = 1 << 20
    retry_after: int = 1
    max_batch: int = 16
    batch_budget: str = "auto"
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    prefix_cache_mb: int = 512
    shutdown_timeout: float = 30.0
    header_timeout: float = 30.0
    body_timeout: float = 60.0
    keep_alive_timeout: float = 5.0

    def __post_init__(self):
        if self.api_key is not None and (not self.api_key or not self.api_key.isprintable() or " " in self.api_key):
            raise ForetellError("--api-key must be a non-empty token without spaces")
        if self.max_queue < 1:
            raise ForetellError(f"--max-queue must be >= 1, got {self.max_queue}")
        if not self.request_timeout > 0:
            raise ForetellError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")
        if self.max_body_bytes < 1024:
            raise ForetellError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_batch < 1 or self.prefill_chunk < 1:
            raise ForetellError(f"--max-batch and --prefill-chunk must be >= 1, got {self.max_batch} and {self.prefill_chunk}")
        if self.prefix_cache_mb < 0:
            raise ForetellError(f"--prefix-cache-mb must be >= 0 (0 turns it off), got {self.prefix_cache_mb}")
        if self.batch_budget not in ("auto", "fixed", "none"):
            raise ForetellError(f"--batch-budget must be auto, fixed or none, got {self.batch_budget!r}")
        if not self.shutdown_timeout >= 0:
            raise ForetellError(f"--shutdown-timeout must be >= 0 seconds, got {self.shutdown_timeout}")
        for flag, seconds in (("--header-timeout", self.header_timeout), ("--body-timeout", self.body_timeout),
                              ("--keep-alive-timeout", self.keep_alive_timeout)):
            if not seconds > 0:
                raise ForetellError(f"{flag} must be > 0 seconds, got {seconds}")
        if self.retry_after < 0:
            raise ForetellError(f"retry_after must be >= 0 seconds, got {self.retry_after}")
