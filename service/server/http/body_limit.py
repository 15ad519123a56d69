"""The request body limit, as pure ASGI middleware: it must act before the body is read (dependencies run after
FastAPI has parsed it)."""

from __future__ import annotations

from http import HTTPStatus

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.server.openai_compat.errors import openai_error


class BodyLimitMiddleware:
    """413 for bodies over the limit: from Content-Length before reading, else while streaming in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and length.isdigit():
            if int(length) > self.max_bytes:
                return await self._reject(scope, receive, send)
            if "transfer-encoding" not in headers:
                # The HTTP parser delivers no more than the declared length: nothing to count, and no wrapper
                # around `send` for each chunk of the answer.
                return await self.app(scope, receive, send)
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
