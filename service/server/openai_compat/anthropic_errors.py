"""Anthropic's error shape on Anthropic's routes (/v1/messages and /v1/messages/count_tokens): every refusal there,
the service's own (401, 403, 413, 429/503 with Retry-After, the strict checks' 400) and vLLM's, reaches Anthropic's
clients as `{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}`, with the status kept.
vLLM's own router passes the OpenAI type name through ("BadRequestError",
vllm/entrypoints/anthropic/api_router.py `translate_error_response`), which Anthropic's SDK does not know. Pure ASGI
middleware: it holds back only an error's JSON body, so streams pass through as they come."""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ANTHROPIC_PATHS = ("/v1/messages",)  # and every path under it

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    return TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_body(status: int, body: Any) -> dict[str, Any]:
    """An error body of either shape (the OpenAI one's message, vLLM's Anthropic one's) in Anthropic's."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = json.dumps(body) if body is not None else f"HTTP {status}"
    return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}


def is_anthropic_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)


class AnthropicErrorsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_anthropic_path(scope["path"]):
            return await self.app(scope, receive, send)
        start: Message | None = None
        chunks: list[bytes] = []

        async def rewriting_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                content_type = MutableHeaders(raw=message["headers"]).get("content-type", "")
                if message["status"] >= 400 and content_type.startswith("application/json"):
                    start = message  # held until the whole body is in
                    return
                return await send(message)
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            try:
                body = json.loads(b"".join(chunks))
            except ValueError:
                body = None
            rewritten = json.dumps(anthropic_body(start["status"], body)).encode()
            headers = MutableHeaders(raw=list(start["headers"]))
            headers["content-length"] = str(len(rewritten))
            await send({**start, "headers": headers.raw})
            await send({"type": "http.response.body", "body": rewritten})

        await self.app(scope, receive, rewriting_send)
