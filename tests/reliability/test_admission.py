"""Engine admission as a FastAPI dependency: the drain relies on its in-flight count lasting until a
streamed response has been sent completely."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import Depends, FastAPI
from fastapi.responses import StreamingResponse

from service.server.http.admission import engine_admission, sequences_beyond_admission
from service.server.openai_compat.errors import install_error_handlers
from service.server.supervision.lifecycle import Lifecycle, Phase


def _app(lifecycle: Lifecycle, seen: list[int]) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app, on_engine_dead=lambda: "engine died")

    @app.post("/v1/completions", dependencies=[Depends(engine_admission(lifecycle, max_queued=4, model=None))])
    async def stream() -> StreamingResponse:
        async def chunks():
            for i in range(3):
                await asyncio.sleep(0.01)
                seen.append(lifecycle.in_flight)  # still counted while the stream is being sent
                yield f"data: {i}\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


async def _post(app: FastAPI, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.post("/v1/completions", json=body)


def test_streamed_request_counts_in_flight_until_its_last_chunk():
    lifecycle, seen = Lifecycle(phase=Phase.READY), []
    resp = asyncio.run(_post(_app(lifecycle, seen), {"prompt": "hi"}))
    assert resp.status_code == 200 and resp.text.count("data:") == 3
    assert seen == [1, 1, 1] and lifecycle.in_flight == 0


def test_not_accepting_is_503_with_retry_after_and_not_counted():
    for phase in (Phase.STARTING, Phase.DRAINING, Phase.DEAD):
        lifecycle = Lifecycle(phase=phase)
        resp = asyncio.run(_post(_app(lifecycle, []), {"prompt": "hi"}))
        assert resp.status_code == 503 and resp.headers["retry-after"]
        assert resp.json()["error"]["code"] == 503 and phase.value in resp.json()["error"]["message"]
        assert lifecycle.in_flight == 0


def test_more_sequences_than_admission_is_400_naming_n():
    lifecycle = Lifecycle(phase=Phase.READY)
    resp = asyncio.run(_post(_app(lifecycle, []), {"prompt": "hi", "n": 5}))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"
    assert "needs 5 sequences" in resp.json()["error"]["message"] and lifecycle.in_flight == 0
    assert sequences_beyond_admission({"n": 4}, 4) is None
    assert sequences_beyond_admission({"n": 5}, 0) is None  # no cap configured
    assert sequences_beyond_admission(["not", "an", "object"], 4) is None  # left to vLLM's validation
    # A batch of chat conversations needs a sequence for each.
    batch = "/v1/chat/completions/batch"
    refused = sequences_beyond_admission({"messages": [[{"role": "user", "content": "hi"}]] * 5}, 4, batch)
    assert refused is not None and refused.param == "messages" and "needs 5 sequences" in refused.message
    assert sequences_beyond_admission({"messages": [[]] * 4}, 4, batch) is None
    assert sequences_beyond_admission({"messages": [[]] * 5}, 4, "/v1/chat/completions") is None  # one conversation
    # n sequences for each prompt a completion lists (texts or token-id lists; a list of ids is one prompt).
    completions = "/v1/completions"
    refused = sequences_beyond_admission({"prompt": ["a", "b", "c"], "n": 2}, 4, completions)
    assert refused is not None and refused.param == "prompt" and "needs 6 sequences" in refused.message
    assert sequences_beyond_admission({"prompt": [[1, 2]] * 5}, 4, completions).param == "prompt"
    assert sequences_beyond_admission({"prompt": list(range(50))}, 4, completions) is None
    assert sequences_beyond_admission({"prompt": "a", "n": 5}, 4, completions).param == "n"
    assert sequences_beyond_admission({"prompt": ["a", "b"], "n": 2}, 4, completions) is None
    # SageMaker's /invocations counts as what vLLM serves it as: a completion, or a chat when it has messages.
    assert sequences_beyond_admission({"prompt": ["a"] * 5}, 4, "/invocations").param == "prompt"
    assert sequences_beyond_admission({"messages": [], "prompt": ["a"] * 5}, 4, "/invocations") is None
