"""How many requests the port holds at once, as pure ASGI middleware: requests in flight are counted, not sockets
(a silent connection is closed by request_head_timeout.py before it is a request), and the probes and the scrape
have a reservation of their own that API traffic cannot take.

The engine turns away what it cannot admit in the OpenAI shape with Retry-After (max_queued_requests); this cap
bounds the tasks and memory a flood of requests can take before they reach it, at a multiple of that limit (the
reliability tests send 4x the admitted count and must get the engine's own answer)."""

from __future__ import annotations

from http import HTTPStatus

from starlette.types import ASGIApp, Receive, Scope, Send

from service.server.openai_compat.errors import RETRY_AFTER_SECONDS, openai_error

REQUESTS_PER_ADMITTED = 8
# Probes and /metrics: a kubelet, a load balancer and a Prometheus or two; each answers in milliseconds.
RESERVED_REQUESTS = 64


def request_limit(max_queued: int) -> int | None:
    """API requests the port holds at once for a queue limit (max_queued_requests; 0: no cap, and no limit either)."""
    return REQUESTS_PER_ADMITTED * max_queued if max_queued else None


class RequestCapMiddleware:
    """503 + Retry-After once `limit` API requests are in flight, or `reserved_limit` requests to `reserved_paths`."""

    def __init__(self, app: ASGIApp, limit: int | None, reserved_paths: frozenset[str], reserved_limit: int) -> None:
        self.app, self.reserved_paths = app, reserved_paths
        self.limits = {False: limit, True: reserved_limit}
        self.in_flight = {False: 0, True: 0}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        reserved = scope["path"] in self.reserved_paths
        limit = self.limits[reserved]
        if limit is not None and self.in_flight[reserved] >= limit:
            what = "probe and metrics" if reserved else "API"
            response = openai_error(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"the server holds {limit} {what} requests at once and is at that limit: retry later",
                "ServiceUnavailableError",
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
            return await response(scope, receive, send)
        self.in_flight[reserved] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[reserved] -= 1
