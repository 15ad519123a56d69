"""Which requests reach the engine: a FastAPI dependency of every engine route.

503 + Retry-After while the engine starts or the service drains; 400 for a request that could never be
admitted; the requests in flight counted until their response (streamed ones too) has been sent, so a
drain knows when they are done."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

from fastapi import Request

from service.server.errors import RETRY_AFTER_SECONDS, ServiceError
from service.server.lifecycle import Lifecycle

# Requests whose body asks for several sequences at once (`n`).
_SAMPLING_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})


def sequences_beyond_admission(body: Any, max_queued: int) -> ServiceError | None:
    """vLLM answers 503 (retry later) to a request that needs more sequences than --max-num-queued-reqs,
    although it could never be admitted: retrying is pointless, so it is the client's error."""
    n = body.get("n") if isinstance(body, dict) else None
    if max_queued and isinstance(n, int) and n > max_queued:
        return ServiceError(
            HTTPStatus.BAD_REQUEST,
            f"this request needs {n} sequences but the server admits at most {max_queued} at a time "
            "(max_queued_requests): ask for fewer",
            "BadRequestError",
            param="n",
        )
    return None


def engine_admission(lifecycle: Lifecycle, max_queued: int) -> Callable[[Request], AsyncIterator[None]]:
    async def admit(request: Request) -> AsyncIterator[None]:
        if not lifecycle.accepting:
            raise ServiceError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"service is {lifecycle.phase.value}: {lifecycle.reason}",
                "ServiceUnavailableError",
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
        if request.method == "POST" and request.url.path in _SAMPLING_ROUTES:
            # FastAPI has parsed the body for the route already; request.json() returns that parse.
            problem = sequences_beyond_admission(await request.json(), max_queued)
            if problem is not None:
                raise problem
        lifecycle.request_started()
        try:
            yield
        finally:
            # FastAPI runs this after the response has been sent, the last chunk of a stream included.
            lifecycle.request_finished()

    return admit
