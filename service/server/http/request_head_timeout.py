"""uvicorn's HTTP protocol with a deadline for each request's head: a connection that has not sent its request line
and headers within HEAD_TIMEOUT_S of its first byte (or of its opening) is closed.

uvicorn starts no timer when a connection opens and its keep-alive timer only after a response, so a client that
connects and sends nothing, or one header byte a second (slowloris), held its socket and a file descriptor for good.
Its `limit_concurrency` also counted those sockets, so a few hundred silent connections turned every request, the
probes' included, into 503; the service now caps requests in flight instead (request_cap.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Clients write a request's head at once; one that has not finished it in this long is broken or hostile. Longer than
# a TCP retransmission or two, shorter than the probes' period (kubelet's default timeout is 1 s, period 10 s).
HEAD_TIMEOUT_S = 5.0


class HeadTimeoutProtocol(HttpToolsProtocol):
    """Closes the connection when a request's head does not arrive in time. The timer runs from the connection's
    opening and, on a kept-alive connection, from the first byte of each later request: an idle kept-alive
    connection is left to uvicorn's keep-alive timeout."""

    head_timeout_s = HEAD_TIMEOUT_S
    on_timeout: Callable[[], None] = staticmethod(lambda: None)  # counts the connections closed (metrics)
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a later request on a kept-alive connection
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            type(self).on_timeout()
            self.transport.close()


def head_timeout_protocol(timeout_s: float, on_timeout: Callable[[], None]) -> type[HeadTimeoutProtocol]:
    """The protocol class for uvicorn's `http` setting, with its deadline and its counter."""
    return type(
        "HeadTimeoutProtocol",
        (HeadTimeoutProtocol,),
        {"head_timeout_s": timeout_s, "on_timeout": staticmethod(on_timeout)},
    )
