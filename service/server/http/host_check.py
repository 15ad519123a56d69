"""The Host header check of a keyless loopback service (policy/exposure/access.py decides when it applies), as pure ASGI
middleware so that it acts before any route, the catch-all's included. The probes stay open to any Host: kubelets
and load balancers probe by IP."""

from __future__ import annotations

from http import HTTPStatus

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.server.openai_compat.errors import openai_error

OPEN_PATHS = frozenset({"/health", "/ready"})


def host_name(header: str) -> str:
    """`localhost:8000` -> `localhost`, `[::1]:8000` -> `[::1]`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostCheckMiddleware:
    def __init__(self, app: ASGIApp, names: tuple[str, ...]) -> None:
        self.app, self.names = app, frozenset(names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        name = host_name(Headers(scope=scope).get("host", ""))
        if name in self.names:
            return await self.app(scope, receive, send)
        response = openai_error(
            HTTPStatus.FORBIDDEN,
            f"Host {name!r} is not served: without an API key the service answers only {', '.join(sorted(self.names))} "
            "(SERVICE_ALLOWED_HOSTS adds names)",
            "PermissionDeniedError",
        )
        await response(scope, receive, send)
