"""The two layers that cannot be FastAPI dependencies, as pure ASGI middleware (safe for streaming).

A body limit must act before the body is read (dependencies run after FastAPI has parsed it), and a stream's
status must be decided after its first event (a dependency runs before the response starts)."""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.server.errors import RETRY_AFTER_SECONDS, error_type, openai_error

log = logging.getLogger("service.http")


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


def _sse_error(chunk: bytes) -> dict[str, Any] | None:
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
    first event: an error there becomes a plain error response with its status (Retry-After on 503); anything
    else streams on unchanged. Cost: one check of the first body chunk per event stream."""

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
                    status = HTTPStatus(error["code"])
                    response = openai_error(
                        status,
                        str(error.get("message") or status.phrase),
                        str(error.get("type") or error_type(status)),
                        headers={"Retry-After": RETRY_AFTER_SECONDS}
                        if status == HTTPStatus.SERVICE_UNAVAILABLE
                        else None,
                    )
                    log.info("stream failed before its first token: answering %d instead of 200", status)
                    return await response(scope, receive, send)
                await send(start)
            await send(message)

        await self.app(scope, receive, checking_send)
        if held is not None:  # ended without any body message
            await send(held)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
