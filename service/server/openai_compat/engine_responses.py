"""What the engine routes answer beyond vLLM's own handlers: each of their endpoints is wrapped here.

A stream that fails before its first event answers with that error's HTTP status, not 200. vLLM's streaming
chat starts its 200 event stream before the engine admits the request; when admission fails (queue full) the
only event is `data: {"error": {... "code": 503}}`. To clients, load balancers and metrics that is an accepted
request that failed. An event stream sends its response start only once its first event is known; an error there
becomes a plain error response with its status (Retry-After on 503), anything else streams on unchanged.

A request that the shutdown ends (the grace period is over, or a second signal came: run.py aborts it in the
engine) answers 503 + Retry-After, or, once its stream has started, ends with an error event and `[DONE]` as
vLLM ends a stream that fails. Without this, uvicorn cancelled them: a plain-text 500 and streams cut mid-event.

A request the engine's death ends answers as one the shutdown ends (503 + Retry-After, or an error event and
`[DONE]`), saying how the engine died (engine_death.py) instead of vLLM's 500 "See stack trace (above)".

A request past the deployment's deadline (request_timeout) is dropped by the engine (its task is cancelled, which
aborts it in vLLM) and answers 504, or, once its stream has started, ends with an error event and `[DONE]`.

A request the admission changed (its output limit bounded, hosted tools left out: admission.py) says so in headers.

A 404 for an unknown model names the LoRA adapters among the valid names, as vLLM's names only the base model.

A 400 that vLLM sent without `param` gets the field its message or the request's body names (error_fields.unnamed_field:
an output constraint that does not compile is in the one field that holds the request's constraint).

Done on the response object, not as ASGI middleware: a middleware wraps `send` for every chunk of every stream
(64 chunks, 64 extra coroutine calls per request); here the chunks pass through one loop of our own, which reads
one attribute and compares one prefix per chunk.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Send

from service.server.openai_compat.error_fields import parsed_body, unnamed_field
from service.server.openai_compat.errors import (
    RETRY_AFTER_SECONDS,
    ServiceError,
    dead_engine_message,
    error_type,
    openai_error,
)
from service.server.supervision.lifecycle import Lifecycle

log = logging.getLogger("service.http")
# How vLLM starts an event that ends a stream with an error (serving.py: `data: {json.dumps({"error": ...})}`), as
# the str and bytes a stream's chunks come as.
ERROR_EVENT = ('data: {"error"', b'data: {"error"')
ERROR_EVENT_LEN = len(ERROR_EVENT[0])
# How vLLM's 404 for an unknown model lists the names it serves (serve/engine/serving.py, _check_model).
_VALID_NAMES = "Valid aliases: "


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
    """An event stream whose status waits for its first event, and which the shutdown can end."""

    lifecycle: Lifecycle
    request: Request | None  # read only when the stream fails before its first event
    deadline: Deadline

    @classmethod
    def of(
        cls, response: StreamingResponse, lifecycle: Lifecycle, request: Request | None, deadline: Deadline
    ) -> FirstEventCheckedStream:
        checked = cls(response.body_iterator, response.status_code, media_type=response.media_type)
        checked.raw_headers = response.raw_headers
        checked.background = response.background
        checked.lifecycle = lifecycle
        checked.request = request
        checked.deadline = deadline
        return checked

    def _encoded(self, chunk: str | bytes | memoryview) -> bytes | memoryview:
        return chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)

    async def stream_response(self, send: Send) -> None:
        chunks: AsyncIterator[Any] = aiter(self.body_iterator)
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        timeout = asyncio.timeout_at(self.deadline.at)
        try:
            async with timeout:
                await self._stream(chunks, tracked)
        except TimeoutError:
            if not timeout.expired():
                raise
            await _close(chunks)
            error = self.deadline.error()
            if not started:
                return await self._send_error(error, None, send)
            body = f"data: {json.dumps({'error': error})}\n\ndata: [DONE]\n\n".encode()
            await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _stream(self, chunks: AsyncIterator[Any], send: Send) -> None:
        first = b""
        async for chunk in chunks:  # the first non-empty chunk (an empty one says nothing yet)
            first = self._encoded(chunk)
            if first:
                break
        error = sse_error(bytes(first))
        if error is None and self.lifecycle.cut_reason is not None:
            error = _cut_error(self.lifecycle.cut_reason)
        elif error is not None and self.lifecycle.engine_errored:
            error = _dead_error(self.lifecycle.engine_died())
        if error is not None:
            await _close(chunks)
            return await self._send_error(error, parsed_body(self.request), send)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        async for chunk in chunks:
            error = None
            if self.lifecycle.cut_reason is not None:  # this chunk is the engine's abort: the error replaces it
                error = _cut_error(self.lifecycle.cut_reason)
            elif chunk[:ERROR_EVENT_LEN] in ERROR_EVENT and self.lifecycle.engine_errored:  # vLLM's "See stack trace"
                error = _dead_error(self.lifecycle.engine_died())
            if error is not None:
                await _close(chunks)
                body = f"data: {json.dumps({'error': error})}\n\ndata: [DONE]\n\n".encode()
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await send({"type": "http.response.body", "body": self._encoded(chunk), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _send_error(error: dict[str, Any], body: Any, send: Send) -> None:
        status = HTTPStatus(error["code"])
        message = str(error.get("message") or status.phrase)
        param = error.get("param") or (unnamed_field(message, body) if status == HTTPStatus.BAD_REQUEST else None)
        response = openai_error(
            status,
            message,
            str(error.get("type") or error_type(status)),
            param=param,
            headers={"Retry-After": RETRY_AFTER_SECONDS} if status == HTTPStatus.SERVICE_UNAVAILABLE else None,
        )
        log.info("stream failed before its first event: answering %d instead of 200", status)
        await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body, "more_body": False})


def _with_param(response: JSONResponse, body: Any) -> Response:
    """vLLM's 400 with the field it is about, when vLLM left `param` empty and the message and body name it."""
    try:
        error = json.loads(bytes(response.body))["error"]
    except (ValueError, KeyError, TypeError):
        return response
    param = None if error.get("param") else unnamed_field(str(error.get("message") or ""), body)
    if param is None:
        return response
    named = error | {"type": error.get("type") or error_type(response.status_code), "param": param}
    return JSONResponse({"error": named}, status_code=response.status_code)


def _with_adapters(response: JSONResponse, request: Request | None) -> Response:
    """vLLM's 404 for an unknown model with the LoRA adapters among the valid names: vLLM's lists the base model's
    only, though requests may name any adapter loaded at start."""
    models = getattr(request.app.state, "openai_serving_models", None) if request is not None else None
    adapters = list(getattr(models, "lora_requests", None) or ())
    try:
        error = json.loads(bytes(response.body))["error"]
        head, sep, _ = str(error["message"]).partition(_VALID_NAMES)
    except (ValueError, KeyError, TypeError):
        return response
    if not (adapters and sep):
        return response
    names = ", ".join([base.name for base in models.base_model_paths] + adapters)
    return JSONResponse({"error": error | {"message": f"{head}{sep}{names}."}}, status_code=response.status_code)


def _unstored(response: Response) -> Response:
    """vLLM's 404 for a response id ("Response with id 'resp_...' not found.") says why where vLLM keeps no responses:
    its store (VLLM_ENABLE_RESPONSES_API_STORE) is off unless the user sets it, as it keeps every response in memory
    for good (vllm/entrypoints/openai/responses/serving.py: "this may cause a memory leak")."""
    from vllm import envs

    if envs.VLLM_ENABLE_RESPONSES_API_STORE or not isinstance(response, JSONResponse):
        return response
    try:
        error = json.loads(bytes(response.body))["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        return response
    if not (message.startswith("Response with id") and message.endswith("not found.")):
        return response
    why = (
        f"{message} This service stores no responses (VLLM_ENABLE_RESPONSES_API_STORE is off: vLLM's store keeps "
        "every response in memory for good): retrieve, cancel and previous_response_id find none; send the earlier "
        "turns in `input` instead"
    )
    return JSONResponse({"error": error | {"message": why}}, status_code=response.status_code)


class Deadline:
    """A request's deadline (request_timeout), in the event loop's clock, from its arrival; `at` None: none."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else asyncio.get_running_loop().time() + seconds

    def error(self) -> dict[str, Any]:
        return {
            "message": f"the request took longer than this deployment's request_timeout of {self.seconds:g} s and was "
            "stopped: ask for fewer tokens (max_tokens) or send it again",
            "type": error_type(HTTPStatus.GATEWAY_TIMEOUT),
            "param": None,
            "code": int(HTTPStatus.GATEWAY_TIMEOUT),
        }

    def refusal(self) -> ServiceError:
        error = self.error()
        return ServiceError(HTTPStatus.GATEWAY_TIMEOUT, error["message"], error["type"])


def _request_of(kwargs: dict[str, Any]) -> Request | None:
    return next((value for value in kwargs.values() if isinstance(value, Request)), None)


def _cut_error(reason: str) -> dict[str, Any]:
    return {
        "message": f"the service is shutting down and ended this request unfinished ({reason}): retry it",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": int(HTTPStatus.SERVICE_UNAVAILABLE),
    }


def _dead_error(reason: str) -> dict[str, Any]:
    return {
        "message": dead_engine_message(reason),
        "type": "ServiceUnavailableError",
        "param": None,
        "code": int(HTTPStatus.SERVICE_UNAVAILABLE),
    }


def _refuse_if_cut(lifecycle: Lifecycle) -> None:
    if lifecycle.cut_reason is not None:
        error = _cut_error(lifecycle.cut_reason)
        raise ServiceError(
            HTTPStatus.SERVICE_UNAVAILABLE,
            error["message"],
            error["type"],
            headers={"Retry-After": RETRY_AFTER_SECONDS},
        )


async def _close(chunks: AsyncIterator[Any]) -> None:
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()


def _with_service_headers(response: Any, request: Request | None) -> Any:
    """The headers that say what the admission changed in the request (admission.py wrote them down)."""
    notes = getattr(request.state, "service_headers", None) if request is not None else None
    if notes and isinstance(response, Response) and response.status_code < HTTPStatus.BAD_REQUEST:
        response.headers.update(notes)
    return response


def engine_endpoint(
    endpoint: Callable[..., Any], lifecycle: Lifecycle, deadline_s: float | None = None
) -> Callable[..., Any]:
    """`endpoint` (a FastAPI endpoint; its signature stays visible to FastAPI) with its event streams checked, its
    answer replaced by a 503 when the shutdown ends it and by a 504 past `deadline_s`."""
    if not inspect.iscoroutinefunction(endpoint):
        return endpoint  # a sync endpoint does not stream from the engine

    @functools.wraps(endpoint)
    async def checked(*args: Any, **kwargs: Any) -> Any:
        _refuse_if_cut(lifecycle)  # the engine, paused by the cut, would queue the request
        deadline = Deadline(deadline_s)
        timeout = asyncio.timeout_at(deadline.at)
        try:
            async with timeout:  # a cancelled generation is aborted in the engine (vLLM's AsyncLLM.generate)
                response = await endpoint(*args, **kwargs)
        except TimeoutError:
            if timeout.expired():
                raise deadline.refusal() from None
            raise
        _refuse_if_cut(lifecycle)  # the cut aborted it in the engine: its answer is unfinished
        request = _request_of(kwargs)
        response = _with_service_headers(response, request)
        if (
            type(response) is StreamingResponse
            and response.status_code == HTTPStatus.OK
            and (response.media_type or "").startswith("text/event-stream")
        ):
            return FirstEventCheckedStream.of(response, lifecycle, request, deadline)
        if isinstance(response, JSONResponse) and response.status_code == HTTPStatus.BAD_REQUEST:
            return _with_param(response, parsed_body(request))
        if isinstance(response, JSONResponse) and response.status_code == HTTPStatus.NOT_FOUND:
            return _unstored(_with_adapters(response, request))
        return response

    return checked
