"""uvicorn as foretell runs it: HTTP/1.1 through h11 with a header timeout and a keep-alive timeout, and a
shutdown that ends the requests still running at --shutdown-timeout with an error instead of cancelling them.

uvicorn's own shutdown cancels the requests' tasks once its graceful timeout passes: a stream is cut mid-chunk,
a waiting request gets a plain-text 500, and each task logs a CancelledError traceback. Here the worker is
stopped first, so every request still running is answered the normal way (a JSON 503, or an error event and
[DONE] in a stream), and uvicorn's timeout is only a backstop that should never fire.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from foretell.serve.settings import ServeSettings

log = logging.getLogger("foretell.serve")

class HeaderTimeoutH11(H11Protocol):
    """h11's protocol, closing a connection whose request line and headers take longer than `header_timeout`
    seconds, counted from the connection's opening or from the first byte of a later request. uvicorn times out
    idle keep-alive connections, but not one that opened and never finished its headers."""

    header_timeout: float = ServeSettings.header_timeout
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._start_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._between_requests():
            self._start_header_timer()  # the first byte of the next request starts its clock
        super().data_received(data)
        if not self._between_requests():  # a request's head arrived whole
            self._stop_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _start_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._between_requests() and not self.transport.is_closing():
            log.info("closed a connection that sent no whole request head in %g s", self.header_timeout)
            self.transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutH11]:
    return type("HeaderTimeoutH11", (HeaderTimeoutH11,), {"header_timeout": seconds})


class Server(uvicorn.Server):
    """A uvicorn server for an app from create_app, with the timeouts of the app's settings."""

    # After the requests still running were ended: seconds their errors get to reach the clients before the
    # connections left are closed (a client that stopped reading, or never sent its whole body, would otherwise
    # keep its connection open until uvicorn's backstop cancels the request).
    ending_grace = 5.0
    # uvicorn's own timeout, counted from --shutdown-timeout: after the worker's stop (which lets a pass end, up
    # to 10 s) and the grace, so it cancels a request (with a traceback) only if the above failed.
    backstop = 30.0

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"):
        settings: ServeSettings = app.state.settings
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                http=header_timeout_protocol(settings.header_timeout),
                                timeout_keep_alive=settings.keep_alive_timeout,
                                timeout_graceful_shutdown=settings.shutdown_timeout + self.backstop)
        super().__init__(config)
        self.settings = settings
        self.worker = app.state.worker
        self.closed = 0  # connections closed after that, their response unfinished

    async def shutdown(self, sockets=None) -> None:
        ending = asyncio.create_task(self._end_requests_in_flight())
        try:
            await super().shutdown(sockets)  # stop accepting, wait for the requests, then the app's lifespan
        finally:
            ending.cancel()
        print(f"foretell serve: {self.exit_message()}", file=sys.stderr, flush=True)

    async def _end_requests_in_flight(self) -> None:
        await asyncio.sleep(self.settings.shutdown_timeout)
        await asyncio.to_thread(self.worker.stop)  # each request still in flight gets ShuttingDown
        deadline = time.monotonic() + self.ending_grace
        while self.server_state.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.server_state.connections):
            connection.transport.close()  # the request's task sees a disconnect and returns
            self.closed += 1

    def exit_message(self) -> str:
        ended, parts = self.worker.ended_by_shutdown, []
        if ended:
            parts.append(f"{ended} request(s) still in flight were answered with an error (503, or an error event "
                         "in a stream)")
        if self.closed:
            parts.append(f"{self.closed} connection(s) were closed with their response unfinished")
        if not parts:
            return "shut down cleanly"
        return f"shut down after --shutdown-timeout ({self.settings.shutdown_timeout:g} s): " + "; ".join(parts)
