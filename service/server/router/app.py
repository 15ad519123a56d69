"""The model table's HTTP front: the service's own routes answered here (probes, metrics, hardware, the model list and
its admin routes), every other request relayed to the engine its body's `model` names, loading it first if need be.
The same gates as one model's service (http/app.py add_gates), then the key."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
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
from service.server.http.routes import Access, Route
from service.server.openai_compat.errors import RETRY_AFTER_SECONDS, ServiceError, error_type, install_error_handlers
from service.server.router.engines import Engine, Engines, NotServed, State
from service.server.router.names import listed_name
from service.server.router.relay import relay
from service.server.router.router_metrics import RouterMetrics
from service.settings import Settings
from service.startup.table_report import TableReport

_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@dataclass(frozen=True)
class Front:
    """What the front end's routes answer from (app.state.front)."""

    table: dict[str, Any]  # the table's plan, as /v1/hardware gives it
    software: dict[str, str | None]
    engines: Engines
    metrics: RouterMetrics
    started: asyncio.Event
    client: httpx.AsyncClient
    aliases: dict[str, tuple[str, ...]]  # listed name -> its aliases
    wait_s: float


def _front(request: Request) -> Front:
    front: Front = request.app.state.front
    return front


def _named(front: Front, model: str) -> Engine:
    name = listed_name(model, front.aliases)
    if name is None:
        raise ServiceError(
            HTTPStatus.NOT_FOUND,
            f"The model `{model}` does not exist. Listed: {', '.join(front.aliases)}.",
            "NotFoundError",
            param="model",
        )
    return front.engines.engines[name]


async def _acquire(front: Front, engine: Engine) -> Engine:
    try:
        return await front.engines.acquire(engine.name, front.wait_s)
    except NotServed as exc:
        status = HTTPStatus.SERVICE_UNAVAILABLE
        headers = {"Retry-After": RETRY_AFTER_SECONDS} if exc.retry else None
        raise ServiceError(status, str(exc), error_type(status), param="model", headers=headers) from exc


async def health(request: Request) -> Response:
    """Liveness: the front end answers; each model's state beside it (one model's engine ending is not the service's
    death)."""
    return JSONResponse({"status": "alive", "models": _states(_front(request).engines)})


async def ready(request: Request) -> Response:
    """Readiness: the pinned models loaded; the others load on their first request."""
    front = _front(request)
    status = 200 if front.started.is_set() else 503
    body = {"status": "ready" if front.started.is_set() else "starting", "models": _states(front.engines)}
    return JSONResponse(body, status_code=status)


async def version(request: Request) -> dict[str, Any]:
    return _front(request).software


async def prometheus(request: Request) -> Response:
    front = _front(request)
    texts = await _each_loaded(front.engines, front.client, "/metrics", lambda r: r.text)
    return Response(front.metrics.render(texts), media_type=CONTENT_TYPE_LATEST)


async def hardware(request: Request) -> dict[str, Any]:
    """The memory plan of the whole box, and each engine's plan: its live report once loaded."""
    front = _front(request)
    live = await _each_loaded(front.engines, front.client, "/v1/hardware", lambda r: r.json())
    models = []
    for listed, engine in zip(front.table["models"], front.engines.engines.values(), strict=True):
        models.append(
            listed | {"state": engine.state.value} | ({"plan": live[engine.name]} if engine.name in live else {})
        )
    keys = ("loaded_at_once", "loaded_at_once_reason", "cpus", "errors")
    return {key: front.table[key] for key in keys} | {"models": models}


def _card(engine: Engine) -> dict[str, Any]:
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


async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_card(e) for e in _front(request).engines.engines.values()]}


async def get_model(request: Request, model: str) -> dict[str, Any]:
    return _card(_named(_front(request), model))


async def load_model(request: Request, model: str) -> dict[str, Any]:
    front = _front(request)
    engine = _named(front, model)
    await front.engines.load(engine.name, front.wait_s)
    return _card(engine)


async def unload_model(request: Request, model: str) -> dict[str, Any]:
    front = _front(request)
    engine = _named(front, model)
    if (refused := await front.engines.unload(engine.name)) is not None:
        raise ServiceError(HTTPStatus.CONFLICT, refused, error_type(HTTPStatus.CONFLICT), param="model")
    return _card(engine)


async def relayed(request: Request) -> Response:
    """Every other request, to the engine its `model` names (loaded first if need be)."""
    front = _front(request)
    body = await request.body()
    model = _model_of(body)
    if model is None and request.headers.get("content-type", "").startswith("multipart/form-data"):
        # audio transcriptions and translations name their model as a form field
        field = (await request.form()).get("model")
        model = field if isinstance(field, str) and field else None
    if model is None:
        raise ServiceError(
            HTTPStatus.BAD_REQUEST,
            f"this service serves several models: name one in the JSON body's `model` ({', '.join(front.aliases)})",
            error_type(HTTPStatus.BAD_REQUEST),
            param="model",
        )
    engine = await _acquire(front, _named(front, model))
    assert engine.url is not None
    release = functools.partial(front.engines.release, engine)
    return await relay(front.client, request, body, engine.url, front.engines.key, engine.name, release)


# The front end's own routes; every other path is relayed (Access.ENGINE: the key, then the named engine).
ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", Access.PROBE, health),
    Route("GET", "/ready", Access.PROBE, ready),
    Route("GET", "/version", Access.METRICS, version),
    Route("GET", "/metrics", Access.METRICS, prometheus),
    Route("GET", "/v1/hardware", Access.SERVICE, hardware),
    Route("GET", "/v1/models", Access.SERVICE, list_models),
    Route("POST", "/v1/models/{model:path}/load", Access.SERVICE, load_model),
    Route("POST", "/v1/models/{model:path}/unload", Access.SERVICE, unload_model),
    Route("GET", "/v1/models/{model:path}", Access.SERVICE, get_model),
)
UNCOUNTED = frozenset(r.path for r in ROUTES if r.access in (Access.PROBE, Access.METRICS))


def create_router_app(
    settings: Settings, table: TableReport, engines: Engines, metrics: RouterMetrics, started: asyncio.Event
) -> FastAPI:
    app = FastAPI(title="CPU LLM service (model table)", openapi_url=None, docs_url=None, redoc_url=None)
    install_error_handlers(app, on_engine_dead=lambda: "an engine ended")
    needs_key = [Depends(require_api_key(api_key_of(settings).value))]
    dependencies = {
        Access.PROBE: [],
        Access.METRICS: needs_key if settings.metrics_require_auth else [],
        Access.SERVICE: needs_key,
    }
    # An answer streams as long as it generates; connections unbounded here, since the request cap bounds requests.
    client = httpx.AsyncClient(timeout=httpx.Timeout(5, read=None), limits=httpx.Limits(max_connections=None))
    first = table.models[0].report.software
    software = {"service": first.service, "vllm": first.vllm, "torch": first.torch, "zentorch": first.zentorch}
    aliases = {name: engine.aliases for name, engine in engines.engines.items()}
    wait_s = settings.model_load_wait_seconds
    app.state.front = Front(table.to_dict(), software, engines, metrics, started, client, aliases, wait_s)
    for route in ROUTES:
        app.add_api_route(route.path, route.handler, methods=[route.method], dependencies=dependencies[route.access])
    app.router.routes.append(APIRoute("/{path:path}", relayed, methods=_ANY_METHOD, dependencies=needs_key))
    add_gates(app, settings, UNCOUNTED)
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
