"""Every answer names its request in `x-request-id`: the client's own X-Request-Id, or a new one. A new one is also
put into the request's headers, where vLLM's chat and completion serving take the engine's request id from, so the
header, the answer's id (`chatcmpl-<id>`, `cmpl-<id>`) and vLLM's log lines of the request name the same one
(/v1/responses makes its `resp_` id from the body instead). OpenAI's API sends
x-request-id with every answer (the official client reads it as `_request_id`); vLLM sends one only with
--enable-request-id-headers, and then a random one that matches nothing else when the client sent none.
Pure ASGI middleware, so that refusals made before routing (413, 401, 503) carry it too."""

from __future__ import annotations

import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = Headers(scope=scope).get(HEADER)
        if not request_id:  # none sent, or an empty one: vLLM would take "" as the id
            request_id = uuid.uuid4().hex
            MutableHeaders(scope=scope)[HEADER] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
