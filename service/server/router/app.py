"""The model table's HTTP front: the service's own routes answered here (probes, metrics, hardware, the model list and
its admin routes), every other request relayed to the engine its body's `model` names, loading it first if need be.
The same gates as one model's service (http/app.py add_gates), then the key."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST

from service.facts.api_key import api_key_of
from service.server.http.app import add_gates
from service.server.http.auth import require_api_key
from service.server.openai_compat.errors import RETRY_AFTER_SECONDS, ServiceError, error_type, install_error_handlers
from service.server.router.engines import Engine, Engines, NotServed, State
from service.server.router.names import listed_name
from service.server.router.relay import relay
from service.server.router.router_metrics import RouterMetrics
from service.settings import Settings
from service.startup.table_report import TableReport

_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_PROBES = ("/health", "/ready", "/version", "/metrics")


def create_router_app(
    settings: Settings, table: TableReport, engines: Engines, metrics: RouterMetrics, started: asyncio.Event
) -> FastAPI:
    app = FastAPI(title="CPU LLM service (model table)", openapi_url=None, docs_url=None, redoc_url=None)
    install_error_handlers(app, on_engine_dead=lambda: "an engine ended")
    needs_key = [Depends(require_api_key(api_key_of(settings).value))]
    metrics_deps = needs_key if settings.metrics_require_auth else []
    # An answer streams as long as it generates; connections unbounded here, since the request cap bounds requests.
    client = httpx.AsyncClient(timeout=httpx.Timeout(5, read=None), limits=httpx.Limits(max_connections=None))
    aliases = {name: engine.aliases for name, engine in engines.engines.items()}
    wait_s = settings.model_load_wait_seconds
    planned = table.to_dict()

    def named(model: str) -> Engine:
        name = listed_name(model, aliases)
        if name is None:
            raise ServiceError(
                HTTPStatus.NOT_FOUND,
                f"The model `{model}` does not exist. Listed: {', '.join(aliases)}.",
                "NotFoundError",
                param="model",
            )
        return engines.engines[name]

    async def acquire(engine: Engine) -> Engine:
        try:
            return await engines.acquire(engine.name, wait_s)
        except NotServed as exc:
            status = HTTPStatus.SERVICE_UNAVAILABLE
            headers = {"Retry-After": RETRY_AFTER_SECONDS} if exc.retry else None
            raise ServiceError(status, str(exc), error_type(status), param="model", headers=headers) from exc

    async def health() -> Response:
        """Liveness: the front end answers; each model's state beside it (one model's engine ending is not the
        service's death)."""
        return JSONResponse({"status": "alive", "models": {n: e.state.value for n, e in engines.engines.items()}})

    async def ready() -> Response:
        """Readiness: the pinned models loaded; the others load on their first request."""
        status = 200 if started.is_set() else 503
        body = {"status": "ready" if started.is_set() else "starting", "models": _states(engines)}
        return JSONResponse(body, status_code=status)

    async def version() -> dict[str, Any]:
        first = table.models[0].report.software
        return {"service": first.service, "vllm": first.vllm, "torch": first.torch, "zentorch": first.zentorch}

    async def prometheus() -> Response:
        texts = await _each_loaded(engines, client, "/metrics", lambda r: r.text)
        return Response(metrics.render(texts), media_type=CONTENT_TYPE_LATEST)

    async def hardware() -> dict[str, Any]:
        """The memory plan of the whole box, and each engine's plan: its live report once loaded."""
        live = await _each_loaded(engines, client, "/v1/hardware", lambda r: r.json())
        models = []
        for listed, engine in zip(planned["models"], engines.engines.values(), strict=True):
            models.append(
                listed | {"state": engine.state.value} | ({"plan": live[engine.name]} if engine.name in live else {})
            )
        keys = ("loaded_at_once", "loaded_at_once_reason", "cpus", "errors")
        return {key: planned[key] for key in keys} | {"models": models}

    def card(engine: Engine) -> dict[str, Any]:
        return {
            "id": engine.name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "cpu-llm-service",
            "state": engine.state.value,
            "reason": engine.reason,
            "aliases": list(engine.aliases),
            "pinned": engine.pinned,
            "load_seconds": engine.load_seconds,
            "pid": engine.process.pid if engine.process is not None else None,  # its engine's process group
            "cpus": list(engine.cpus) if engine.cpus else None,  # its slot, where the table's CPUs are split
        }

    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [card(e) for e in engines.engines.values()]}

    async def get_model(model: str) -> dict[str, Any]:
        return card(named(model))

    async def load_model(model: str) -> dict[str, Any]:
        engine = named(model)
        await engines.load(engine.name, wait_s)
        return card(engine)

    async def unload_model(model: str) -> dict[str, Any]:
        engine = named(model)
        if (refused := await engines.unload(engine.name)) is not None:
            raise ServiceError(HTTPStatus.CONFLICT, refused, error_type(HTTPStatus.CONFLICT), param="model")
        return card(engine)

    async def relayed(request: Request) -> Response:
        body = await request.body()
        model = _model_of(body)
        if model is None and request.headers.get("content-type", "").startswith("multipart/form-data"):
            # audio transcriptions and translations name their model as a form field
            field = (await request.form()).get("model")
            model = field if isinstance(field, str) and field else None
        if model is None:
            raise ServiceError(
                HTTPStatus.BAD_REQUEST,
                f"this service serves several models: name one in the JSON body's `model` ({', '.join(aliases)})",
                error_type(HTTPStatus.BAD_REQUEST),
                param="model",
            )
        engine = await acquire(named(model))
        assert engine.url is not None
        return await relay(client, request, body, engine.url, engines.key, engine.name, lambda: engines.release(engine))

    for path, handler, deps in (
        ("/health", health, []),
        ("/ready", ready, []),
        ("/version", version, metrics_deps),
        ("/metrics", prometheus, metrics_deps),
        ("/v1/hardware", hardware, needs_key),
        ("/v1/models", list_models, needs_key),
    ):
        app.add_api_route(path, handler, methods=["GET"], dependencies=deps)
    app.add_api_route("/v1/models/{model:path}/load", load_model, methods=["POST"], dependencies=needs_key)
    app.add_api_route("/v1/models/{model:path}/unload", unload_model, methods=["POST"], dependencies=needs_key)
    app.add_api_route("/v1/models/{model:path}", get_model, methods=["GET"], dependencies=needs_key)
    app.router.routes.append(APIRoute("/{path:path}", relayed, methods=_ANY_METHOD, dependencies=needs_key))
    add_gates(app, settings, frozenset(_PROBES))
    app.state.client = client
    return app


def _model_of(body: bytes) -> str | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) and model else None


def _states(engines: Engines) -> dict[str, str]:
    return {name: engine.state.value for name, engine in engines.engines.items()}


async def _each_loaded(
    engines: Engines, client: httpx.AsyncClient, path: str, read: Callable[[httpx.Response], Any]
) -> dict[str, Any]:
    """`path` of every loaded engine, read; an engine that does not answer is left out (it is ending)."""
    loaded = [e for e in engines.engines.values() if e.state is State.LOADED and e.url]
    headers = {"Authorization": f"Bearer {engines.key}"}

    async def one(engine: Engine) -> Any:
        try:
            response = await client.get(f"{engine.url}{path}", headers=headers, timeout=10)
            return read(response) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    answers = await asyncio.gather(*(one(e) for e in loaded))
    return {e.name: a for e, a in zip(loaded, answers, strict=True) if a is not None}
