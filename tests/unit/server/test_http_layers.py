"""The two HTTP layers around vLLM's routes that are not FastAPI dependencies: the wrapper of their endpoints
(service/server/openai_compat/engine_responses.py: the stream-start check, requests the shutdown ends) and the body limit (service/server/http/body_limit.py), on a small FastAPI
app in-process. The real server's answers (a full queue, a 10 MB body) are in tests/reliability/."""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from vllm import SamplingParams
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.utils.api_utils import validate_json_request
from vllm.v1.engine.exceptions import EngineDeadError

from service.server.http.body_limit import BodyLimitMiddleware
from service.server.openai_compat.engine_responses import engine_endpoint, sse_error
from service.server.openai_compat.errors import install_error_handlers
from service.server.supervision.lifecycle import Lifecycle

LIMIT = 1000
CUT = object()  # in an event list: the shutdown ends the request here; the next event is the engine's abort
DIE = object()  # in an event list: the engine dies here; the next event is vLLM's error event
# vLLM's engine after its engine core was killed: its manager holds the reaped process (a multiprocessing.Process).
KILLED_ENGINE = SimpleNamespace(
    errored=True,
    engine_core=SimpleNamespace(
        resources=SimpleNamespace(
            engine_manager=SimpleNamespace(processes=[SimpleNamespace(pid=1, name="EngineCore_DP0", exitcode=-9)])
        )
    ),
)
# What vLLM's serving layer sends a stream when the engine died.
VLLM_DEAD_EVENT = {
    "error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
}


def _event(data: object) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _app(events: list, closed: list[bool], lifecycle: Lifecycle | None = None, calls: list | None = None) -> FastAPI:
    app = FastAPI()
    lifecycle = lifecycle or Lifecycle()
    install_error_handlers(app, on_engine_dead=lifecycle.engine_died)

    async def stream():
        try:
            for event in events:
                if event is CUT:
                    lifecycle.cut_reason = "shutdown grace period of 3s over"
                elif event is DIE:
                    lifecycle.engine = KILLED_ENGINE
                else:
                    yield event
        finally:
            closed.append(True)

    # A JSON body parameter, as vLLM's routes have: FastAPI reads the body. No return annotation: FastAPI would
    # make it a response model.
    async def completions(body: dict[str, Any]):
        if calls is not None:
            calls.append(body)
        if body.get("cut"):  # the shutdown ends it while the engine computes the answer
            lifecycle.cut_reason = "SIGTERM received twice"
            return JSONResponse({"choices": [{"finish_reason": "abort"}]})
        if body.get("die"):  # the engine dies while it computes the answer
            lifecycle.engine = KILLED_ENGINE
            raise EngineDeadError()
        if body.get("refuse"):  # vLLM's error response, as its serving layer returns one
            return JSONResponse({"error": body["refuse"]}, status_code=400)
        if not body.get("stream"):
            return JSONResponse({"echo": len(json.dumps(body))})
        return StreamingResponse(stream(), media_type="text/event-stream")

    app.add_api_route("/v1/completions", engine_endpoint(completions, lifecycle), methods=["POST"])
    app.add_middleware(BodyLimitMiddleware, max_bytes=LIMIT)
    return app


def _post(app: FastAPI, **kwargs) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/completions", **kwargs)

    return asyncio.run(go())


def test_a_stream_whose_first_event_is_an_error_answers_with_its_status():
    closed: list[bool] = []
    error = {"error": {"message": "queue is full", "type": "ServiceUnavailableError", "code": 503}}
    resp = _post(_app([_event(error), _event({"never": "sent"})], closed), json={"stream": True})
    assert resp.status_code == 503
    assert resp.headers["retry-after"]
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"]["message"] == "queue is full"
    assert resp.json()["error"]["code"] == 503
    assert closed == [True]  # the stream was closed, not left pending


@pytest.mark.parametrize(
    ("error", "param"),
    [
        (
            {
                "message": "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)"
            },
            "logprobs",
        ),
        ({"message": "top_k must be 0 (disable), or at least 1, got -5."}, "top_k"),
        ({"message": "x", "param": "stop_token_ids"}, "stop_token_ids"),  # vLLM's own param is kept
        ({"message": "something else must be right"}, None),
    ],
)
def test_a_stream_refused_before_its_first_event_names_the_field(error, param):
    event = {"error": {"type": "BadRequestError", "code": 400, **error}}
    resp = _post(_app([_event(event)], []), json={"stream": True})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (  # named from its message; vLLM's other fields kept, a missing type filled in
            {"message": "top_k must be 0 (disable), or at least 1, got -5.", "code": 400, "extra": 1},
            {"type": "BadRequestError", "param": "top_k", "code": 400, "extra": 1},
        ),
        (
            {"message": "top_k must be 0 (disable), or at least 1, got -5.", "type": "BadRequestError", "code": 400},
            {"type": "BadRequestError", "param": "top_k", "code": 400},
        ),
        (  # vLLM's own param, and an error no field can be named for, pass through as they are
            {"message": "x", "type": "BadRequestError", "param": "stop_token_ids", "code": 400},
            {"type": "BadRequestError", "param": "stop_token_ids", "code": 400},
        ),
        ({"message": "something else", "code": 400}, {"code": 400}),
    ],
)
def test_a_refusal_without_param_names_the_field(error, expected):
    resp = _post(_app([], []), json={"refuse": error})
    assert resp.status_code == 400
    assert resp.json()["error"] == {"message": error["message"], **expected}, resp.text


def test_a_stream_that_starts_well_streams_every_event_unchanged():
    events = ["", _event({"text": "a"}), _event({"error": {"code": 500, "message": "later"}}), "data: [DONE]\n\n"]
    resp = _post(_app(events, []), json={"stream": True})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.text == "".join(events)  # an error after the first event is the stream's own business


def test_an_empty_stream_is_an_empty_200():
    resp = _post(_app([], []), json={"stream": True})
    assert resp.status_code == 200
    assert resp.text == ""


def test_responses_that_are_not_streams_pass_through():
    resp = _post(_app([], []), json={"stream": False, "x": 1})
    assert resp.status_code == 200
    assert resp.json() == {"echo": len(json.dumps({"stream": False, "x": 1}))}


def _assert_cut(error: dict, reason: str) -> None:
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableError" and error["param"] is None
    assert "shutting down" in error["message"] and reason in error["message"]


def test_a_request_the_shutdown_ends_answers_503_with_retry_after():
    resp = _post(_app([], []), json={"cut": True})
    assert resp.status_code == 503 and int(resp.headers["retry-after"]) > 0
    _assert_cut(resp.json()["error"], "SIGTERM received twice")


def test_a_stream_the_shutdown_ends_after_its_start_ends_with_an_error_event_and_done():
    closed: list[bool] = []
    events = [_event({"text": "a"}), _event({"text": "b"}), CUT, _event({"finish_reason": "abort"}), _event("x")]
    resp = _post(_app(events, closed), json={"stream": True})
    assert resp.status_code == 200
    assert resp.text.startswith(_event({"text": "a"}) + _event({"text": "b"}))
    assert resp.text.endswith("data: [DONE]\n\n")
    last = resp.text.split("\n\n")[-3]  # the event before [DONE]: the error, in place of the engine's abort
    assert last.startswith("data: ") and "abort" not in resp.text
    _assert_cut(json.loads(last[6:])["error"], "grace period of 3s over")
    assert closed == [True]


def test_a_stream_the_shutdown_ends_before_its_first_event_answers_503():
    closed: list[bool] = []
    resp = _post(_app([CUT, _event({"finish_reason": "abort"})], closed), json={"stream": True})
    assert resp.status_code == 503 and resp.headers["retry-after"]
    _assert_cut(resp.json()["error"], "grace period of 3s over")
    assert closed == [True]


def test_once_the_shutdown_ends_requests_the_endpoint_is_not_called():
    lifecycle, calls = Lifecycle(), []
    lifecycle.cut_reason = "SIGTERM received twice"
    resp = _post(_app([], [], lifecycle, calls), json={"stream": True})
    assert resp.status_code == 503 and calls == []  # a paused engine would have queued it until the exit
    _assert_cut(resp.json()["error"], "SIGTERM received twice")


def _assert_dead(error: dict) -> None:
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableError", error
    assert error["message"].startswith("engine died: the engine core was killed by SIGKILL"), error
    assert error["message"].endswith("retry this request"), error


def test_a_request_the_dying_engine_held_answers_503_saying_how_it_died():
    lifecycle = Lifecycle()
    resp = _post(_app([], [], lifecycle), json={"die": True})
    assert resp.status_code == 503 and int(resp.headers["retry-after"]) > 0
    _assert_dead(resp.json()["error"])
    assert lifecycle.phase.value == "dead" and "killed by SIGKILL" in lifecycle.reason


def test_a_stream_the_dying_engine_ends_gets_an_error_event_saying_how_and_done():
    closed: list[bool] = []
    events = [_event({"text": "a"}), DIE, _event(VLLM_DEAD_EVENT), "data: [DONE]\n\n"]
    resp = _post(_app(events, closed), json={"stream": True})
    assert resp.status_code == 200 and resp.text.startswith(_event({"text": "a"}))
    assert resp.text.endswith("data: [DONE]\n\n") and "stack trace" not in resp.text
    _assert_dead(json.loads(resp.text.split("\n\n")[-3][6:])["error"])
    assert closed == [True]


def test_a_stream_the_dying_engine_ends_before_its_first_event_answers_503():
    resp = _post(_app([DIE, _event(VLLM_DEAD_EVENT)], []), json={"stream": True})
    assert resp.status_code == 503 and resp.headers["retry-after"]
    _assert_dead(resp.json()["error"])


def test_an_error_event_of_a_live_engine_passes_unchanged():
    events = [_event({"text": "a"}), _event(VLLM_DEAD_EVENT), "data: [DONE]\n\n"]
    resp = _post(_app(events, []), json={"stream": True})
    assert resp.status_code == 200 and resp.text == "".join(events)


@pytest.mark.parametrize(
    ("chunk", "code"),
    [
        (b'data: {"error": {"code": 400, "message": "m"}}\n\n', 400),
        (b'data: {"error": {"code": 503}}\n\n', 503),
        (b'data: {"error": {"code": 200}}\n\n', None),  # not an error status
        (b'data: {"error": {"code": 999}}\n\n', None),  # not a status at all
        (b'data: {"error": "text"}\n\n', None),
        (b'data: {"choices": []}\n\n', None),
        (b"data: not json\n\n", None),
        (b": ping\n\n", None),
    ],
)
def test_sse_error_recognises_only_an_error_event_with_an_http_error_code(chunk, code):
    error = sse_error(chunk)
    assert (error["code"] if error else None) == code


def test_a_body_within_the_declared_limit_is_served():
    body = {"stream": False, "prompt": "x" * (LIMIT - 100)}
    resp = _post(_app([], []), json=body)
    assert resp.status_code == 200
    assert resp.json() == {"echo": len(json.dumps(body))}


def test_a_declared_length_over_the_limit_is_413():
    resp = _post(_app([], []), json={"stream": False, "prompt": "x" * LIMIT})
    assert resp.status_code == 413
    assert f"{LIMIT} bytes" in resp.json()["error"]["message"]


def test_a_chunked_body_over_the_limit_is_413_and_one_within_is_served():
    async def chunks(n: int):  # no Content-Length: httpx sends it chunked
        yield b'{"stream": false, "prompt": "'
        for _ in range(n):
            yield b"x" * 100
        yield b'"}'

    over = _post(_app([], []), content=chunks(20), headers={"content-type": "application/json"})
    assert over.status_code == 413
    within = _post(_app([], []), content=chunks(5), headers={"content-type": "application/json"})
    assert within.status_code == 200


def _schema_app() -> FastAPI:
    """vLLM's own chat request model behind the service's error handlers."""
    app = FastAPI()
    app.state.args = Namespace(log_error_stack=False)  # vLLM's validation handler reads it
    install_error_handlers(app, on_engine_dead=lambda: "engine died")

    async def chat(request: ChatCompletionRequest):
        return JSONResponse({})

    app.add_api_route("/v1/completions", chat, methods=["POST"])
    return app


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [USER], "seed": "x"}, "seed"),
        ({"messages": [USER], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": "hi"}, "messages"),
        # Each role is a shape of its own; the user shape fails on name alone, the others on role too.
        ({"messages": [USER, {"role": "user", "content": "hi", "name": 5}]}, "messages[1].name"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [USER], "logprobs": [1]}, "logprobs"),
        # vLLM checks tool calls item by item: the errors' locations start at the item, the field is not named
        # here (the service's request checks name it before vLLM sees the request).
        ({"messages": [{"role": "assistant", "content": "a", "tool_calls": [{"id": 1}]}]}, None),
    ],
)
def test_schema_errors_name_the_field_as_openai_does(body, param):
    resp = _post(_schema_app(), json={"model": "m", **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError" and error["code"] == 400, error
    assert "validation error" in error["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # vLLM: "6 validation errors:" and six dicts, one per shape of response_format
        ({"messages": [USER], "response_format": {"type": "xml"}}, "response_format.type: Input should be 'text', "),
        # the list's own error, not the string branch's "Input should be a valid string"
        ({"messages": [USER], "stop": ["a", "b", "c", "d", "e"]}, "stop: List should have at most 4 items"),
        (
            {"messages": [USER], "seed": "x" * 100},
            f'seed: Input should be a valid integer, unable to parse string as an integer (got "{"x" * 39}...',
        ),
        (
            {"messages": [USER, {"role": "user", "content": "hi", "name": 5}]},
            "messages[1].name: Input should be a valid string (got 5)",
        ),
    ],
)
def test_a_schema_error_is_one_line_about_the_field_it_names(body, message):
    error = _post(_schema_app(), json={"model": "m", **body}).json()["error"]
    assert error["message"].startswith(f"validation error: {message}") and "\n" not in error["message"], error


def _json_route_app() -> FastAPI:
    """The schema app's route with vLLM's own Content-Type check, as vLLM's routes have it."""
    app = _schema_app()
    app.router.routes.clear()

    async def chat(request: ChatCompletionRequest):
        return JSONResponse({})

    app.add_api_route("/v1/completions", chat, methods=["POST"], dependencies=[Depends(validate_json_request)])
    return app


@pytest.mark.parametrize(
    ("content", "headers", "message"),
    [
        (b"not json", {}, "the request body is not valid JSON: Expecting value at character 0"),
        (
            b'{"model": "m",}',
            {},
            "the request body is not valid JSON: Expecting property name enclosed in double quotes",
        ),
        (b"[1, 2]", {}, "the request body must be a JSON object, not an array"),
        (b'"hi"', {}, "the request body must be a JSON object, not a string"),
        (b"7", {}, "the request body must be a JSON object, not a number"),
        (b"null", {}, "the request body is empty or null: send a JSON object"),
        (b"{}", {"content-type": "text/plain"}, "Unsupported Media Type: Only 'application/json' is allowed"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_one_line_about_the_body(content, headers, message):
    # vLLM: "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.0', ...}", a Python dict
    headers = {"content-type": "application/json", **headers}
    resp = _post(_json_route_app(), content=content, headers=headers)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["message"].startswith(message) and "\n" not in error["message"], error
    assert error["type"] == "BadRequestError" and error["param"] is None


def _sampling_app() -> FastAPI:
    """vLLM's SamplingParams checks, raised from an endpoint, answered by the service's handlers."""
    app = FastAPI()
    install_error_handlers(app, on_engine_dead=lambda: "engine died")

    async def completions(body: dict[str, Any]):
        SamplingParams(**body)
        return JSONResponse({})

    app.add_api_route("/v1/completions", completions, methods=["POST"])
    return app


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": -5}, "top_k"),
        ({"stop": [""]}, "stop"),
        ({"min_tokens": 10, "max_tokens": 3}, "min_tokens"),
        ({"min_p": 2.0}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"temperature": 9.0}, "temperature"),  # vLLM names this one itself
        ({"logprobs": -5}, "logprobs"),
    ],
)
def test_engine_sampling_errors_name_the_field_their_message_names(fields, param):
    resp = _post(_sampling_app(), json=fields)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and param in error["message"], error
