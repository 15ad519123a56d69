"""A stream that fails before its first event answers with that error's HTTP status, not 200.

vLLM's streaming chat starts its 200 event stream before the engine admits the request; when admission fails
(queue full) the only event is `data: {"error": {... "code": 503}}`. To clients, load balancers and metrics that
is an accepted request that failed. The engine routes' endpoints are wrapped here: an event stream they return
sends its response start only once its first event is known; an error there becomes a plain error response with
its status (Retry-After on 503), anything else streams on unchanged.

Done on the response object, not as ASGI middleware: a middleware wraps `send` for every chunk of every stream
(64 chunks, 64 extra coroutine calls per request); here the chunks after the first pass through Starlette's own
loop untouched.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Send

from service.server.errors import RETRY_AFTER_SECONDS, error_type, openai_error

log = logging.getLogger("service.http")


def sse_error(chunk: bytes) -> dict[str, Any] | None:
    """The error object when a stream's first event is `data: {"error": {...}}` with an HTTP error code, else None."""
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


class FirstEventCheckedStream(StreamingResponse):
    """An event stream whose status waits for its first event."""

    @classmethod
    def of(cls, response: StreamingResponse) -> FirstEventCheckedStream:
        checked = cls(response.body_iterator, response.status_code, media_type=response.media_type)
        checked.raw_headers = response.raw_headers
        checked.background = response.background
        return checked

    def _encoded(self, chunk: str | bytes | memoryview) -> bytes | memoryview:
        return chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)

    async def stream_response(self, send: Send) -> None:
        chunks: AsyncIterator[Any] = aiter(self.body_iterator)
        first = b""
        async for chunk in chunks:  # the first non-empty chunk (an empty one says nothing yet)
            first = self._encoded(chunk)
            if first:
                break
        error = sse_error(bytes(first))
        if error is not None:
            await _close(chunks)
            return await self._send_error(error, send)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": self._encoded(chunk), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _send_error(error: dict[str, Any], send: Send) -> None:
        status = HTTPStatus(error["code"])
        response = openai_error(
            status,
            str(error.get("message") or status.phrase),
            str(error.get("type") or error_type(status)),
            headers={"Retry-After": RETRY_AFTER_SECONDS} if status == HTTPStatus.SERVICE_UNAVAILABLE else None,
        )
        log.info("stream failed before its first event: answering %d instead of 200", status)
        await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body, "more_body": False})


async def _close(chunks: AsyncIterator[Any]) -> None:
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()


def first_event_checked(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`endpoint` (a FastAPI endpoint; its signature stays visible to FastAPI) with its event streams checked."""
    if not inspect.iscoroutinefunction(endpoint):
        return endpoint  # a sync endpoint does not stream from the engine

    @functools.wraps(endpoint)
    async def checked(*args: Any, **kwargs: Any) -> Any:
        response = await endpoint(*args, **kwargs)
        if (
            type(response) is StreamingResponse
            and response.status_code == HTTPStatus.OK
            and (response.media_type or "").startswith("text/event-stream")
        ):
            return FirstEventCheckedStream.of(response)
        return response

    return checked
