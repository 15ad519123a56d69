"""Pure ASGI middleware (safe for streaming): body size limit, API-key auth, readiness/drain gate."""
from __future__ import annotations

import hashlib
import json
import logging
import secrets
from http import HTTPStatus

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.server.errors import openai_error
from service.server.lifecycle import Lifecycle

log = logging.getLogger("service.http")

# Answered by the service itself at every phase; everything else needs a ready engine.
OWN_PATHS = frozenset({"/health", "/ready", "/metrics", "/version", "/v1/hardware"})
# Status documents for probes: their 503 bodies say why, in their own shape.
PROBE_PATHS = frozenset({"/health", "/ready"})
# Open without the API key (probes, and the version a dashboard shows); /metrics too unless configured.
PUBLIC_PATHS = frozenset({"/health", "/ready", "/version"})
RETRY_AFTER_SECONDS = "5"
ERROR_FIELDS = frozenset({"message", "type", "param", "code"})


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
    """Bearer-key check on every path but the probes and /version (and /metrics unless configured): vLLM's app
    also serves /tokenize, /invocations, /scale_elastic_ep ... outside /v1. Keys are compared as SHA-256
    digests with secrets.compare_digest, so the time taken does not depend on how much of the key matched."""

    def __init__(self, app: ASGIApp, key: str, protect_metrics: bool) -> None:
        self.app = app
        self.digest = hashlib.sha256(key.encode()).digest()
        self.public = PUBLIC_PATHS if protect_metrics else PUBLIC_PATHS | {"/metrics"}

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        offered = hashlib.sha256(token.strip().encode()).digest()
        return secrets.compare_digest(offered, self.digest) and scheme.lower() == "bearer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        if scope["path"] not in self.public and not self._authorized(Headers(scope=scope)):
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


def _error_type(status: int) -> str:
    try:
        name = HTTPStatus(status).phrase.title().replace(" ", "").replace("-", "")
    except ValueError:
        name = "Http"
    return name if name.endswith("Error") else name + "Error"


def _is_openai_error(body: bytes) -> bool:
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and isinstance(data.get("error"), dict) and ERROR_FIELDS <= data["error"].keys()


def _message_of(body: bytes, status: int) -> str:
    """The text of a non-OpenAI error body: FastAPI's {"detail": ...}, else the body itself."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", errors="replace").strip()
    else:
        detail = data.get("detail", data) if isinstance(data, dict) else data
        text = detail if isinstance(detail, str) else json.dumps(detail)[:1000]
    if not text:
        try:
            text = HTTPStatus(status).phrase
        except ValueError:
            text = f"HTTP {status}"
    return text


def _shaped_body(status: int, message: str) -> bytes:
    try:
        http_status = HTTPStatus(status)
    except ValueError:
        http_status = HTTPStatus.INTERNAL_SERVER_ERROR
    body = openai_error(http_status, message, _error_type(status)).body
    if http_status.value != status:  # a status HTTPStatus does not know: keep it in `code`
        data = json.loads(body)
        data["error"]["code"] = status
        body = json.dumps(data).encode()
    return bytes(body)


class ErrorShapeMiddleware:
    """Every error answer (status >= 400) in the OpenAI shape {"error": {"message", "type", "param", "code"}}.

    vLLM shapes the errors of its own handlers, but Starlette/FastAPI answer some on their own with
    {"detail": ...} (404 for an unknown path, 405, 400 for a body that is not UTF-8) or plain text; those are
    rewritten here. An exception that escapes before the response started becomes a shaped 500 instead of
    Starlette's plain-text page. Only error bodies are buffered (up to MAX_BUFFER); successes stream through."""

    MAX_BUFFER = 1 << 20

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            return await self.app(scope, receive, send)
        held: Message | None = None  # the start message of an error response, until its body is complete
        chunks: list[bytes] = []
        size = 0
        started = False

        async def forward(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        async def flush_held(final: bool) -> None:
            nonlocal held
            body = b"".join(chunks)
            start, held = held, None
            chunks.clear()
            if final and not _is_openai_error(body):
                status = start["status"]
                body = _shaped_body(status, _message_of(body, status))
                drop = (b"content-length", b"content-type")
                keep = [(k, v) for k, v in start.get("headers", []) if k.lower() not in drop]
                length = str(len(body)).encode()
                start = {**start, "headers": [*keep, (b"content-type", b"application/json"), (b"content-length", length)]}
                await forward(start)
                await forward({"type": "http.response.body", "body": body, "more_body": False})
                return
            await forward(start)
            await forward({"type": "http.response.body", "body": body, "more_body": not final})

        async def shaping_send(message: Message) -> None:
            nonlocal held, size
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held = message
                return
            if message["type"] == "http.response.body" and held is not None:
                chunk = message.get("body", b"")
                chunks.append(chunk)
                size += len(chunk)
                more = message.get("more_body", False)
                if not more:
                    await flush_held(final=True)
                elif size > self.MAX_BUFFER:
                    await flush_held(final=False)
                return
            await forward(message)

        try:
            await self.app(scope, receive, shaping_send)
        except Exception:
            if started:
                raise
            log.exception("unhandled error answering %s %s", scope.get("method"), scope.get("path"))
            response = openai_error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error", "InternalServerError")
            await response(scope, receive, send)


def _sse_error(chunk: bytes) -> dict | None:
    """The error object when a stream's first event is `data: {"error": {...}}`, else None."""
    if not chunk.startswith(b"data: "):
        return None
    line = chunk[6:].split(b"\n", 1)[0]
    try:
        data = json.loads(line)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and 400 <= code <= 599 and code in HTTPStatus._value2member_map_:
        return error
    return None


class StreamStartErrorMiddleware:
    """A stream that fails before its first token answers with that error's HTTP status, not 200.

    vLLM's streaming chat starts the 200 event stream before the engine admits the request; when admission
    fails (queue full) the only event is `data: {"error": {... "code": 503}}`. To clients, load balancers and
    metrics that is an accepted request that failed. Here the response start of an event stream waits for the
    first event: an error there becomes a plain error response with its status (and, through
    EngineGateMiddleware, Retry-After on 503); anything else streams on unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: Message | None = None
        decided = False
        swallow = False

        async def checking_send(message: Message) -> None:
            nonlocal held, decided, swallow
            if swallow:
                return
            if message["type"] == "http.response.start" and not decided:
                content_type = Headers(raw=message.get("headers", [])).get("content-type", "")
                if message["status"] == 200 and content_type.startswith("text/event-stream"):
                    held = message
                    return
                decided = True
                return await send(message)
            if held is not None and message["type"] == "http.response.body":
                body = message.get("body", b"")
                if not body and message.get("more_body", False):
                    return  # nothing yet: keep waiting for the first event
                start, held, decided = held, None, True
                error = _sse_error(body)
                if error is not None:
                    swallow = True
                    status = error["code"]
                    response = openai_error(
                        HTTPStatus(status), str(error.get("message") or HTTPStatus(status).phrase),
                        str(error.get("type") or _error_type(status)),
                    )
                    log.info("stream failed before its first token: answering %d instead of 200", status)
                    return await response(scope, receive, send)
                await send(start)
            await send(message)

        await self.app(scope, receive, checking_send)
        if held is not None:  # ended without any body message
            await send(held)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
