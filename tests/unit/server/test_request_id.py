"""`x-request-id` on every answer (service/server/http/request_id.py), on a small app in-process: the client's own id
echoed, else a new one, which the endpoint (vLLM's serving layer, in the service) sees as the request's header."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from service.server.http.body_limit import BodyLimitMiddleware
from service.server.http.request_id import RequestIdMiddleware


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        # What vLLM's _base_request_id reads: the first X-Request-Id header of the request.
        return JSONResponse({"seen": request.headers.getlist("x-request-id")})

    @app.get("/stream")
    async def stream(request: Request):
        async def events():
            for i in range(3):
                yield f"data: {i}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app.add_middleware(BodyLimitMiddleware, max_bytes=100)
    app.add_middleware(RequestIdMiddleware)
    return app


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://test")


@pytest.mark.parametrize("sent", [{}, {"X-Request-Id": ""}])
async def test_without_an_id_the_answer_and_the_endpoint_get_the_same_new_one(sent):
    async with _client() as client:
        first = await client.post("/echo", json={}, headers=sent)
        second = await client.post("/echo", json={}, headers=sent)
    assert re.fullmatch(r"[0-9a-f]{32}", first.headers["x-request-id"]), first.headers
    assert first.json()["seen"] == [first.headers["x-request-id"]]
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


async def test_the_clients_own_id_is_echoed_and_passed_on_unchanged():
    async with _client() as client:
        answer = await client.post("/echo", json={}, headers={"X-Request-Id": "trace-42/a b"})
    assert answer.headers.get_list("x-request-id") == ["trace-42/a b"]
    assert answer.json()["seen"] == ["trace-42/a b"]


async def test_a_stream_and_refusals_before_routing_carry_it():
    async with _client() as client:
        stream = await client.get("/stream")
        too_big = await client.post("/echo", content=b"x" * 200, headers={"X-Request-Id": "big-1"})
        missing = await client.get("/nowhere")
    assert stream.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n" and stream.headers["x-request-id"]
    assert too_big.status_code == 413 and too_big.headers["x-request-id"] == "big-1"
    assert missing.status_code == 404 and missing.headers["x-request-id"]
