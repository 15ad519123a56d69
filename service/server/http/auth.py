"""The API key, as a FastAPI dependency of every protected route."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from fastapi import Request

from service.server.openai_compat.errors import ServiceError

UNAUTHORIZED = ServiceError(
    HTTPStatus.UNAUTHORIZED,
    "missing or invalid API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
    "AuthenticationError",
    headers={"WWW-Authenticate": "Bearer"},
)


def require_api_key(key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A dependency that refuses requests without `Authorization: Bearer <key>` or `x-api-key: <key>` (a no-op
    without a key).

    Keys are compared as SHA-256 digests with secrets.compare_digest: the time taken depends neither on how
    much of the key matched nor on its length."""
    digest = hashlib.sha256(key.encode()).digest() if key else None

    async def check(request: Request) -> None:
        if digest is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        bearer = hashlib.sha256(token.strip().encode()).digest()
        # Anthropic's SDK sends its key as x-api-key; both are compared, whichever is sent, in the same time.
        x_api_key = hashlib.sha256(request.headers.get("x-api-key", "").strip().encode()).digest()
        by_bearer = secrets.compare_digest(bearer, digest) and scheme.lower() == "bearer"
        by_header = secrets.compare_digest(x_api_key, digest)
        if not (by_bearer | by_header):
            raise UNAUTHORIZED

    return check
