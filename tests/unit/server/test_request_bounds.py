"""What the service changes in a request before vLLM reads it, and what a deployment may bound: the deadline
(request_timeout: engine_responses.py), the output limit (the context and max_tokens_limit: output_limit.py) and
the hosted tools left out (hosted_tools.py), through the admission dependency, on a small FastAPI app in-process whose
routes take vLLM's own request models, as the engine's routes do."""

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

from service.server.http.admission import Bounds, engine_admission
from service.server.openai_compat import hosted_tools, model_aliases
from service.server.openai_compat.engine_responses import engine_endpoint
from service.server.openai_compat.errors import install_error_handlers
from service.server.openai_compat.model_aliases import ModelAliases
from service.server.openai_compat.output_limit import HEADER, OutputBound, limit_output
from service.server.supervision.lifecycle import Lifecycle, Phase

DEADLINE_S = 0.3
LIMIT = 100
CONTEXT = 1024


def _app(seen: list[Any], cancelled: list[str], bounds: Bounds) -> FastAPI:
    lifecycle = Lifecycle()
    lifecycle.set_phase(Phase.READY, "test")
    app = FastAPI()
    install_error_handlers(app, on_engine_dead=lifecycle.engine_died)
    admitted = [Depends(engine_admission(lifecycle, 8, None, bounds))]

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


BOUNDED = Bounds(OutputBound(CONTEXT, LIMIT))


def _post(path: str, body: dict[str, Any], bounds: Bounds = BOUNDED) -> tuple[httpx.Response, list[Any], list[str]]:
    seen: list[Any] = []
    cancelled: list[str] = []

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=_app(seen, cancelled, bounds))
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


def test_a_limit_past_the_context_is_served_up_to_what_fits_without_a_deployment_bound():
    """Claude Code's 32,000 against a 1,024-token context: vLLM refused it (400); now vLLM gets the context, and stops
    the sequence where the context ends."""
    resp, seen, _ = _post("/v1/chat/completions", CHAT | {"max_tokens": 32000}, Bounds(OutputBound(CONTEXT)))
    assert resp.status_code == 200, resp.text
    assert seen[0].max_tokens == CONTEXT
    assert "the context length" in resp.headers[HEADER] and "32000" in resp.headers[HEADER]
    resp, seen, _ = _post("/v1/chat/completions", CHAT, Bounds(OutputBound(CONTEXT)))
    assert seen[0].max_tokens is None and HEADER not in resp.headers  # vLLM's own default: up to the context


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
    limit_output(path, body, OutputBound(CONTEXT, LIMIT))
    assert body.get(field) == value


RESPONSES_BODY = {
    "model": "m",
    "input": "hi",
    "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "multi_agent_v1", "tools": []},
        {"type": "web_search"},
        {"type": "mcp", "server_label": "docs", "server_url": "https://example.com"},
    ],
}


@pytest.mark.parametrize(
    ("path", "body", "kept", "skipped"),
    [  # Codex CLI's default tools: its functions and namespace kept, its hosted web_search left out
        ("/v1/responses", RESPONSES_BODY, ["exec_command", "multi_agent_v1"], ["web_search", "mcp:docs"]),
        (
            "/v1/messages",
            {
                "tools": [
                    {"name": "Bash", "input_schema": {"type": "object"}},
                    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                ],
                "mcp_servers": [{"type": "url", "url": "https://example.com", "name": "x"}],
            },
            ["Bash"],
            ["web_search", "mcp_servers"],
        ),
        ("/v1/chat/completions", {"messages": [], "web_search_options": {}}, None, ["web_search_options"]),
        # forced: refused by name by the request checks, not served without what it forces
        ("/v1/responses", RESPONSES_BODY | {"tool_choice": {"type": "web_search"}}, None, []),
    ],
)
def test_hosted_tools_are_left_out_and_named(path, body, kept, skipped):
    body = json.loads(json.dumps(body))
    assert hosted_tools.skip_hosted_tools(path, body) == skipped
    if kept is not None:
        assert [tool["name"] for tool in body["tools"]] == kept
    if skipped:
        assert "mcp_servers" not in body and "web_search_options" not in body


def test_a_response_says_which_hosted_tools_were_left_out_and_refuse_keeps_the_400():
    body = CHAT | {"web_search_options": {}, "max_tokens": 5}
    resp, seen, _ = _post("/v1/chat/completions", body)
    assert resp.status_code == 200 and "web_search_options" in resp.headers[hosted_tools.HEADER]
    assert "web_search_options" not in (seen[0].model_extra or {})
    resp, seen, _ = _post("/v1/chat/completions", body, Bounds(skip_hosted_tools=False))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "web_search_options" and not seen


ALIASES = Bounds(aliases=ModelAliases("served-model", ("claude-*", "gpt-4o")))


@pytest.mark.parametrize(
    ("asked", "seen_as"),
    [
        ("claude-sonnet-4-5", "served-model"),  # Claude Code's main model
        ("claude-haiku-4-5", "served-model"),  # and its small fast one
        ("gpt-4o", "served-model"),
        ("gpt-4o-mini", "gpt-4o-mini"),  # not listed: vLLM's 404 names it
        ("served-model", "served-model"),
    ],
)
def test_an_alias_is_served_as_the_model_and_the_response_says_so(asked, seen_as):
    resp, seen, _ = _post("/v1/chat/completions", CHAT | {"model": asked, "max_tokens": 5}, ALIASES)
    assert resp.status_code == 200 and seen[0].model == seen_as
    assert (model_aliases.HEADER in resp.headers) is (asked != seen_as)


def test_a_lora_adapter_named_like_an_alias_keeps_its_name():
    assert ModelAliases("served-model", ("claude-*",)).resolve("claude-sql", served_names={"claude-sql"}) is None
