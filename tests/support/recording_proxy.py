"""A loopback proxy in front of a server that records each exchange: the path, the status, the model asked for, the
prompt tokens the answer reports in its usage (streamed or not) and the request's body. The agent tests read how many requests a client
turn makes and how long each prompt is; the service reports usage per answer, its metrics only in sum."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from starlette.requests import Request
from starlette.responses import StreamingResponse

from harness import free_port

# Hop-by-hop or re-framed by the proxy: the body is passed on decoded, in chunks of its own.
_DROPPED = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass(frozen=True)
class Exchange:
    method: str
    path: str
    status: int
    model: str | None  # the request's `model` field
    prompt_tokens: int | None  # from the answer's usage; None when it reports none
    body: bytes = b""  # the request's body, as the client sent it


def prompt_tokens_of(body: bytes) -> int | None:
    """The prompt's tokens in an answer's usage: OpenAI's `prompt_tokens`, the Responses API's `input_tokens`, or
    Anthropic's `input_tokens` with the cached parts it counts apart. An SSE stream repeats them: the largest."""
    counts = [
        (usage.get("input_tokens") or usage.get("prompt_tokens") or 0)
        + (usage.get("cache_read_input_tokens") or 0)
        + (usage.get("cache_creation_input_tokens") or 0)
        for document in _documents(body.decode(errors="replace"))
        for usage in _usages(document)
    ]
    return max(counts, default=None)


def _documents(text: str) -> Iterator[Any]:
    try:
        yield json.loads(text)
        return
    except ValueError:
        pass
    for line in text.splitlines():
        if line.startswith("data:"):
            try:
                yield json.loads(line[len("data:") :])
            except ValueError:
                continue  # "[DONE]"


def _usages(value: Any) -> Iterator[dict]:
    if isinstance(value, dict):
        if isinstance(value.get("usage"), dict):
            yield value["usage"]
        for child in value.values():
            yield from _usages(child)
    elif isinstance(value, list):
        for child in value:
            yield from _usages(child)


def _model_of(body: bytes) -> str | None:
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None


class RecordingProxy:
    """`with RecordingProxy(upstream) as proxy:` point a client at `proxy.url`; `proxy.exchanges` grows as answers
    end."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.in_flight = 0  # requests whose answer has not ended
        self.port = free_port()
        self._server = uvicorn.Server(
            uvicorn.Config(
                self._app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off", interface="asgi3"
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="recording-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the recording proxy did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    async def _app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        body = await request.body()
        client = httpx.AsyncClient(timeout=None)
        upstream = client.build_request(
            request.method,
            self.upstream + request.url.path,
            params=request.url.query,
            headers=[(k, v) for k, v in request.headers.raw if k.decode().lower() not in _DROPPED],
            content=body,
        )
        self.in_flight += 1
        try:
            answer = await client.send(upstream, stream=True)
        except BaseException:
            self.in_flight -= 1
            await client.aclose()
            raise

        async def relay():
            seen = bytearray()
            try:
                async for chunk in answer.aiter_bytes():
                    seen += chunk
                    yield chunk
            finally:  # recorded first: a client that hangs up cancels what follows
                status, model = answer.status_code, _model_of(body)
                self.exchanges.append(
                    Exchange(request.method, request.url.path, status, model, prompt_tokens_of(seen), body)
                )
                self.in_flight -= 1
                await answer.aclose()
                await client.aclose()

        headers = {k: v for k, v in answer.headers.items() if k.lower() not in _DROPPED}
        await StreamingResponse(relay(), status_code=answer.status_code, headers=headers)(scope, receive, send)
