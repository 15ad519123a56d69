"""A request relayed to its model's engine as it came (method, path, query, headers but the key, body) and the
answer streamed back as it goes: the engine's own API answers, in its own shapes. The request counts in flight on
its engine until the last byte is sent or the client leaves."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus

import httpx
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from service.server.openai_compat.errors import RETRY_AFTER_SECONDS, ServiceError, error_type

# Hop-by-hop (RFC 9110) and what the relay sets itself: the engine's key, its address, the body's length.
_NOT_RELAYED = frozenset(
    {
        "host",
        "authorization",
        "x-api-key",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
    }
)
_NOT_RETURNED = frozenset({"connection", "keep-alive", "transfer-encoding", "server", "date"})


class _Relayed(StreamingResponse):
    """Releases its engine once the answer has been sent or the client has left, whichever comes first."""

    def __init__(self, upstream: httpx.Response, release: Callable[[], Awaitable[None]]) -> None:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_RETURNED}
        super().__init__(upstream.aiter_raw(), status_code=upstream.status_code, headers=headers)
        self._upstream, self._release = upstream, release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._upstream.aclose()
            await self._release()


async def relay(
    client: httpx.AsyncClient,
    request: Request,
    body: bytes,
    base_url: str,
    key: str,
    model: str,
    release: Callable[[], Awaitable[None]],
) -> StreamingResponse:
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _NOT_RELAYED]
    url = httpx.URL(base_url + request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    upstream_request = client.build_request(
        request.method, url, headers=[*headers, ("authorization", f"Bearer {key}")], content=body
    )
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as exc:
        await release()
        status = HTTPStatus.SERVICE_UNAVAILABLE
        raise ServiceError(
            status,
            f"the engine of {model!r} did not answer ({type(exc).__name__}): it may have just ended; retry this "
            "request, its model loads again",
            error_type(status),
            headers={"Retry-After": RETRY_AFTER_SECONDS},
        ) from exc
    return _Relayed(upstream, release)
