"""OpenAI-format error responses for what the service itself rejects (auth, size, readiness, overload)."""
from __future__ import annotations

from http import HTTPStatus

from starlette.responses import JSONResponse
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response


def openai_error(
    status: HTTPStatus, message: str, err_type: str, *, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = create_error_response(message, err_type=err_type, status_code=status).model_dump()
    return JSONResponse(body, status_code=int(status), headers=headers)
