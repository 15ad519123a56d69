"""Pure ASGI middleware (safe for streaming): body size limit, API-key auth, readiness/drain gate."""
from __future__ import annotations

import hashlib
import secrets
from http import HTTPStatus

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.server.errors import openai_error
from service.server.lifecycle import Lifecycle

# Answered by the service itself at every phase; everything else needs a ready engine.
OWN_PATHS = frozenset({"/health", "/ready", "/metrics", "/version", "/v1/hardware"})
RETRY_AFTER_SECONDS = "5"


class BodyLimitMiddleware:
    """413 for bodies over the limit: from Content-Length before reading, else while streaming in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(scope, receive, send)
        seen = 0
        started = False
        too_big = False

        async def limited_receive() -> Message:
            nonlocal seen, too_big
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    too_big = True
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if too_big:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, tracking_send)
        if too_big and not started:
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = openai_error(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"request body exceeds the limit of {self.max_bytes} bytes",
            "RequestEntityTooLarge",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


class ApiKeyMiddleware:
    """Bearer-key check on /v1/* (and /metrics when configured). Keys are compared as SHA-256 digests with
    secrets.compare_digest, so the time taken does not depend on how much of the key matched."""

    def __init__(self, app: ASGIApp, key: str, protect_metrics: bool) -> None:
        self.app = app
        self.digest = hashlib.sha256(key.encode()).digest()
        self.prefixes = ("/v1", "/metrics") if protect_metrics else ("/v1",)

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        offered = hashlib.sha256(token.strip().encode()).digest()
        return secrets.compare_digest(offered, self.digest) and scheme.lower() == "bearer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        if scope["path"].startswith(self.prefixes) and not self._authorized(Headers(scope=scope)):
            response = openai_error(
                HTTPStatus.UNAUTHORIZED,
                "missing or invalid API key: send 'Authorization: Bearer <key>'",
                "AuthenticationError",
                headers={"WWW-Authenticate": "Bearer"},
            )
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


class EngineGateMiddleware:
    """503 + Retry-After for engine routes until the engine is ready and while draining; counts requests in
    flight so a drain knows when they are done; adds Retry-After to the engine's own 503s (queue full)."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app, self.lifecycle = app, lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OWN_PATHS:
            return await self.app(scope, receive, send)
        lc = self.lifecycle
        if not lc.accepting:
            response = openai_error(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"service is {lc.phase.value}: {lc.reason}",
                "ServiceUnavailableError",
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
            return await response(scope, receive, send)

        async def send_with_retry_after(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"retry-after" for k, _ in headers):
                    headers.append((b"retry-after", RETRY_AFTER_SECONDS.encode()))
                message = {**message, "headers": headers}
            await send(message)

        lc.request_started()
        try:
            await self.app(scope, receive, send_with_retry_after)
        finally:
            lc.request_finished()
