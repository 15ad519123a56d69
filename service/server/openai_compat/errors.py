"""One error shape for every answer >= 400: OpenAI's {"error": {"message", "type", "param", "code"}}.

The service's own refusals raise ServiceError; framework errors (404, 405, unparsable bodies) arrive as
HTTPException / RequestValidationError; vLLM's serving layer raises its own exception types, which vLLM's
`create_error_response` maps to statuses. All of them are answered by the handlers installed here.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.entrypoints.serve.exception_handling.handlers.validation import validation_exception_handler
from vllm.exceptions import VLLMError
from vllm.v1.engine.exceptions import EngineDeadError

from service.server.openai_compat.error_fields import field_path, parsed_body, schema_message, unnamed_field

log = logging.getLogger("service.http")
RETRY_AFTER_SECONDS = "5"
# vLLM answers 501 when a request asks for something this deployment does not do. OpenAI's API never answers
# 501, and a 5xx would page whoever watches the error rate: the endpoint the model lacks is a 404, an
# unimplemented option a 400.
_ENDPOINT_UNSUPPORTED = "The model does not support"


class ServiceError(Exception):
    """A refusal by the service itself (auth, readiness, admission), answered in the OpenAI shape."""

    def __init__(
        self,
        status: HTTPStatus,
        message: str,
        err_type: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param, self.headers = status, message, err_type, param, headers


def openai_error(
    status: HTTPStatus, message: str, err_type: str, *, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = create_error_response(message, err_type=err_type, status_code=status, param=param).model_dump()
    return JSONResponse(body, status_code=int(status), headers=headers)


def error_type(status: int) -> str:
    """OpenAI-style type name of a status: 404 -> NotFoundError."""
    try:
        name = HTTPStatus(status).phrase.title().replace(" ", "").replace("-", "")
    except ValueError:
        name = "Http"
    return name if name.endswith("Error") else name + "Error"


# vLLM's message for a request that does not fit the schema: "N validation errors:" and each error as a dict.
_ERROR_DUMP = re.compile(r"\d+ validation errors?:\n")


def dead_engine_message(reason: str) -> str:
    """What a request the dead engine held, or one that comes after, is answered (503 + Retry-After)."""
    return f"{reason}: the service is exiting to be restarted; retry this request"


def install_error_handlers(app: FastAPI, on_engine_dead: Callable[[], str]) -> None:
    """`on_engine_dead`: marks the service dead and gives the reason (Lifecycle.engine_died).

    Specific exception types are registered (not only Exception) so that Starlette's ExceptionMiddleware,
    inside the HTTP-metrics middleware, answers them and their status is counted."""

    async def service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        return openai_error(exc.status, exc.message, exc.err_type, param=exc.param, headers=exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        status = HTTPStatus(exc.status_code)
        message = exc.detail if isinstance(exc.detail, str) and exc.detail else status.phrase
        return openai_error(status, message, error_type(status), headers=exc.headers)

    async def engine_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, EngineDeadError):
            # The watchdog owns the exit: /health turns 503 first, then the process exits non-zero. vLLM's own
            # answer (500, "See stack trace (above)") names neither the cause nor that a retry will do.
            message = dead_engine_message(on_engine_dead())
            log.warning("answering 503 to %s %s: %s", request.method, request.url.path, message)
            return openai_error(
                HTTPStatus.SERVICE_UNAVAILABLE,
                message,
                error_type(HTTPStatus.SERVICE_UNAVAILABLE),
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
        err = create_error_response(exc)
        status, message, err_type, headers = err.error.code, err.error.message, err.error.type, None
        if status == HTTPStatus.NOT_IMPLEMENTED:
            status = HTTPStatus.NOT_FOUND if message.startswith(_ENDPOINT_UNSUPPORTED) else HTTPStatus.BAD_REQUEST
            err_type = error_type(status)
        if status == HTTPStatus.SERVICE_UNAVAILABLE:
            headers = {"Retry-After": RETRY_AFTER_SECONDS}
        if status >= HTTPStatus.INTERNAL_SERVER_ERROR and status != HTTPStatus.SERVICE_UNAVAILABLE:
            # A full queue (503) is expected under load and answered with Retry-After: not logged per request.
            log.error("answering %d to %s %s", status, request.method, request.url.path, exc_info=exc)
        param = err.error.param
        if param is None and status == HTTPStatus.BAD_REQUEST:
            param = unnamed_field(message, parsed_body(request))
        return openai_error(HTTPStatus(status), message, err_type, param=param, headers=headers)

    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(HTTPException, http_error)

    async def validation_error(request: Request, exc: Exception) -> Response:
        # vLLM's handler words the message (bounded, no inputs echoed at length); the type and the field are
        # spelled as in the service's other 400s.
        assert isinstance(exc, RequestValidationError)
        error = json.loads(bytes((await validation_exception_handler(request, exc)).body))["error"]
        param, message = error["param"], error["message"]
        if param is None or param.startswith("body") or param[:1].isdigit():  # not named by vLLM's validators
            param = field_path(exc.errors())
        if _ERROR_DUMP.match(message):
            message = schema_message(exc.errors()) or message
        return openai_error(HTTPStatus.BAD_REQUEST, message, error_type(HTTPStatus.BAD_REQUEST), param=param)

    app.add_exception_handler(RequestValidationError, validation_error)
    for exc_type in (VLLMError, ValueError, TypeError, OverflowError, NotImplementedError, Exception):
        app.add_exception_handler(exc_type, engine_error)
