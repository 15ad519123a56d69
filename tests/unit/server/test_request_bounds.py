"""What a deployment may bound per request: its deadline (request_timeout: engine_responses.py) and its output limit
(max_tokens_limit: output_limit.py through the admission dependency), on a small FastAPI app in-process whose routes
take vLLM's own request models, as the engine's routes do."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

from service.server.http.admission import engine_admission
from service.server.openai_compat.engine_responses import engine_endpoint
from service.server.openai_compat.errors import install_error_handlers
from service.server.openai_compat.output_limit import HEADER, limit_output
from service.server.supervision.lifecycle import Lifecycle, Phase

DEADLINE_S = 0.3
LIMIT = 100


def _app(seen: list[Any], cancelled: list[str]) -> FastAPI:
    lifecycle = Lifecycle()
    lifecycle.set_phase(Phase.READY, "test")
    app = FastAPI()
    install_error_handlers(app, on_engine_dead=lifecycle.engine_died)
    admitted = [Depends(engine_admission(lifecycle, 8, None, LIMIT))]

    async def generation(what: str, first_event: bool):
        try:
            if first_event:
                yield f"data: {json.dumps({'choices': [{'text': 'a'}]})}\n\n"
            await asyncio.sleep(60)  # an engine that takes too long
            yield "data: [DONE]\n\n"
        except asyncio.CancelledError:
            cancelled.append(what)  # vLLM's AsyncLLM.generate aborts the request here
            raise

    async def chat(request: ChatCompletionRequest, raw_request: Request):
        seen.append(request)
        if request.stream:
            return StreamingResponse(generation("stream", bool(request.n == 1)), media_type="text/event-stream")
        if request.user == "slow":
            async for _ in generation("call", False):
                pass
        return JSONResponse({"choices": [], "usage": {"completion_tokens": 1}})

    async def completions(request: CompletionRequest, raw_request: Request):
        seen.append(request)
        return JSONResponse({"choices": []})

    for path, endpoint in (("/v1/chat/completions", chat), ("/v1/completions", completions)):
        app.add_api_route(
            path, engine_endpoint(endpoint, lifecycle, DEADLINE_S), methods=["POST"], dependencies=admitted
        )
    return app


def _post(path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Any], list[str]]:
    seen: list[Any] = []
    cancelled: list[str] = []

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=_app(seen, cancelled))
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=10) as client:
            return await client.post(path, json=body)

    return asyncio.run(go()), seen, cancelled


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_request_past_its_deadline_is_stopped_and_answers_504():
    resp, _, cancelled = _post("/v1/chat/completions", CHAT | {"user": "slow", "max_tokens": 5})
    assert resp.status_code == 504, resp.text
    assert "request_timeout" in resp.json()["error"]["message"] and resp.json()["error"]["code"] == 504
    assert cancelled == ["call"]


def test_a_stream_past_its_deadline_before_its_first_event_answers_504():
    resp, _, cancelled = _post("/v1/chat/completions", CHAT | {"stream": True, "n": 2, "max_tokens": 5})
    assert resp.status_code == 504, resp.text
    assert cancelled == ["stream"]


def test_a_stream_past_its_deadline_after_its_start_ends_with_an_error_event_and_done():
    resp, _, cancelled = _post("/v1/chat/completions", CHAT | {"stream": True, "max_tokens": 5})
    assert resp.status_code == 200
    events = [line.removeprefix("data: ") for line in resp.text.split("\n\n") if line]
    assert json.loads(events[0])["choices"][0]["text"] == "a"
    assert json.loads(events[1])["error"]["code"] == 504 and events[2] == "[DONE]"
    assert cancelled == ["stream"]


@pytest.mark.parametrize(
    ("body", "served", "noted"),
    [
        ({"max_tokens": 32000}, LIMIT, True),  # Claude Code's budget: served up to the bound
        ({"max_completion_tokens": 32000}, LIMIT, True),
        ({}, LIMIT, True),  # none given: the whole context otherwise
        ({"max_tokens": 7}, 7, False),
    ],
)
def test_the_engine_reads_the_bounded_output_limit_and_the_response_says_so(body, served, noted):
    resp, seen, _ = _post("/v1/chat/completions", CHAT | body)
    assert resp.status_code == 200, resp.text
    (request,) = seen
    effective = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    assert effective == served
    assert (HEADER in resp.headers) is noted
    if noted and body:
        assert "32000" in resp.headers[HEADER] and str(LIMIT) in resp.headers[HEADER]


def test_a_completion_keeps_its_small_default():
    resp, seen, _ = _post("/v1/completions", {"model": "m", "prompt": "hi"})
    assert resp.status_code == 200 and seen[0].max_tokens == 16 and HEADER not in resp.headers


@pytest.mark.parametrize(
    ("path", "body", "field", "value"),
    [
        ("/v1/responses", {"input": "hi", "max_output_tokens": 10**6}, "max_output_tokens", LIMIT),
        ("/v1/responses", {"input": "hi"}, "max_output_tokens", LIMIT),
        ("/v1/messages", {"messages": [], "max_tokens": 32000}, "max_tokens", LIMIT),
        ("/v1/messages", {"messages": []}, "max_tokens", None),  # required by Anthropic's API: vLLM names it
        ("/invocations", {"messages": [], "max_tokens": 10**6}, "max_tokens", LIMIT),
        ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, "max_tokens", "many"),  # refused by name later
        ("/tokenize", {"prompt": "x", "max_tokens": 10**6}, "max_tokens", 10**6),  # generates nothing
    ],
)
def test_each_generation_route_is_bounded_on_its_own_field(path, body, field, value):
    limit_output(path, body, LIMIT)
    assert body.get(field) == value
