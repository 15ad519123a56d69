"""The HTTP shell: one FastAPI app serving the route table (routes.py), vLLM's listed routes included into it
once the engine is up, the API key and engine admission as dependencies, one set of error handlers."""

from __future__ import annotations

import copy
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Match
from vllm.entrypoints.serve.utils.api_utils import validate_json_request

from service.facts.api_key import api_key_of
from service.policy.access import checked_host_names
from service.server.http.admission import Bounds, engine_admission
from service.server.http.auth import require_api_key
from service.server.http.body_limit import BodyLimitMiddleware
from service.server.http.host_check import HostCheckMiddleware
from service.server.http.lora_routes import OFF, AdapterLoader, lora_handlers
from service.server.http.metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from service.server.http.redact import without_paths
from service.server.http.request_cap import RESERVED_REQUESTS, RequestCapMiddleware, request_limit
from service.server.http.request_id import RequestIdMiddleware
from service.server.http.routes import (
    ENGINE_ROUTES,
    LORA_ROUTES,
    SERVICE_ROUTES,
    UNCOUNTED,
    Access,
    served_engine_route,
)
from service.server.openai_compat.anthropic_errors import AnthropicErrorsMiddleware
from service.server.openai_compat.engine_responses import engine_endpoint
from service.server.openai_compat.errors import ServiceError, install_error_handlers
from service.server.openai_compat.model_aliases import ModelAliases
from service.server.openai_compat.output_limit import OutputBound
from service.server.supervision.lifecycle import Lifecycle, Phase
from service.settings import Settings
from service.startup.report import StartupReport

_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
# Pages on this machine may call the API from a browser, as Ollama allows by default; other pages only when listed
# (cors_origins): without an API key, the default, any page the user opens could otherwise use the model.
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
_DEMO_DESCRIPTION = (
    "built-in demo model with random weights: it answers gibberish; set SERVICE_MODEL to serve a real model"
)


@dataclass(frozen=True)
class HttpShell:
    app: FastAPI
    attach_engine: Callable[[FastAPI], None]  # serve the listed routes of the app vLLM built


def create_app(
    settings: Settings,
    report: StartupReport,
    lifecycle: Lifecycle,
    metrics: ServiceMetrics,
    engine_args: Namespace,
    *,
    served_model: str,
    demo: bool,
) -> HttpShell:
    app = FastAPI(
        title="CPU LLM service",
        version=report.software.service or "unknown",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.args = engine_args  # vLLM's handlers and routes read it
    install_error_handlers(app, on_engine_dead=lifecycle.engine_died)
    key = api_key_of(settings).value
    needs_key = Depends(require_api_key(key))
    rank = report.plan.engine_args.get("max_lora_rank")
    loader = None
    if settings.lora_dir is not None and report.model is not None and rank:
        loader = AdapterLoader(settings.lora_dir, report.model, rank)
    admission = engine_admission(
        lifecycle, settings.max_queued_requests, report.model, _bounds(settings, report, served_model)
    )
    admitted = [needs_key, Depends(admission)]
    dependencies = {
        Access.PROBE: [],
        Access.METRICS: [needs_key] if settings.metrics_require_auth else [],
        Access.SERVICE: [needs_key],
        Access.ENGINE: admitted + ([Depends(loader.load_on_first_use)] if loader else []),
    }
    handlers = _service_handlers(app, report, lifecycle, metrics, demo, tuple(settings.model_aliases))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            if key:
                schema.setdefault("components", {})["securitySchemes"] = {
                    "bearer": {"type": "http", "scheme": "bearer"}
                }
                schema["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    for path, access in SERVICE_ROUTES.items():
        app.add_api_route(
            path,
            handlers[path],
            methods=["GET"],
            dependencies=dependencies[access],
            include_in_schema=path != "/openapi.json",
        )
    if loader is not None:
        for path, handler in lora_handlers(loader).items():
            json_body = Depends(validate_json_request)  # as vLLM's POST routes: a body sent as JSON, or 400 saying so
            app.add_api_route(path, handler, methods=["POST"], dependencies=[*dependencies[Access.ENGINE], json_body])
    # Last: the gate (key, then engine state) applies before routing, like llama.cpp's pre-routing check, so an
    # unknown path answers 401 without the key and 503 while starting, and 404/405 only once vLLM's routes exist.
    catch_all = APIRoute(
        "/{path:path}",
        _not_served(served_model),
        methods=_ANY_METHOD,
        dependencies=dependencies[Access.ENGINE],
        include_in_schema=False,
    )
    app.router.routes.append(catch_all)

    def attach_engine(vllm_app: FastAPI) -> None:
        router = APIRouter()
        router.routes.extend(
            _wrapped(r, lifecycle, settings.request_timeout)
            for r in vllm_app.routes
            if isinstance(r, APIRoute) and served_engine_route(r.path)
        )
        app.router.routes.remove(catch_all)
        app.include_router(router, dependencies=dependencies[Access.ENGINE])
        app.router.routes.append(catch_all)
        app.openapi_schema = None  # rebuilt with vLLM's routes (run.py does it before /ready: seconds of CPU)

    Instrumentator(excluded_handlers=list(UNCOUNTED), registry=metrics.registry).instrument(app)
    add_gates(app, settings, frozenset(UNCOUNTED))
    return HttpShell(app, attach_engine)


def add_gates(app: FastAPI, settings: Settings, reserved_paths: frozenset[str]) -> None:
    """The middlewares every request of the port passes, innermost first (one model's app and the model table's front
    end). `reserved_paths`: the probes and the scrape, which keep requests of their own under the cap."""
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    if (names := checked_host_names(settings.host, api_key_of(settings), settings.allowed_hosts)) is not None:
        app.add_middleware(HostCheckMiddleware, names=names)
    app.add_middleware(RequestIdMiddleware)  # outside the body limit: its 413 names the request too
    app.add_middleware(AnthropicErrorsMiddleware)  # outside every refusal: Anthropic's routes answer in its shape
    app.add_middleware(
        RequestCapMiddleware,
        limit=request_limit(settings.max_queued_requests),
        reserved_paths=reserved_paths,
        reserved_limit=RESERVED_REQUESTS,
    )
    # Outermost: preflights need no API key, and refusals (401, 413, 503) carry the headers a page needs to read them.
    app.add_middleware(
        CORSMiddleware,
        allow_origins=settings.cors_origins,
        allow_origin_regex=LOCAL_ORIGINS,
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=["Retry-After", "X-Request-Id"],
    )


def _bounds(settings: Settings, report: StartupReport, served: str) -> Bounds:
    context = report.plan.engine_args.get("max_model_len")
    output = OutputBound(context=int(context) if context else None, deployment=settings.max_tokens_limit)
    aliases = ModelAliases(served, tuple(settings.model_aliases)) if settings.model_aliases else None
    return Bounds(output=output, skip_hosted_tools=settings.hosted_tools == "skip", aliases=aliases)


def _wrapped(route: APIRoute, lifecycle: Lifecycle, deadline_s: float | None) -> APIRoute:
    """vLLM's route with its endpoint wrapped (engine_responses.py); include_router rebuilds the route from the
    copy, so vLLM's own app is left as it was."""
    wrapped = copy.copy(route)
    wrapped.endpoint = engine_endpoint(route.endpoint, lifecycle, deadline_s)
    return wrapped


def _not_served(served: str) -> Callable[[Request], Any]:
    async def not_served(request: Request) -> None:
        if any(route.matches(request.scope)[0] is Match.PARTIAL for route in request.app.router.routes):
            raise HTTPException(405)
        if request.url.path in LORA_ROUTES:
            raise HTTPException(404, OFF)
        if request.url.path in ENGINE_ROUTES:  # vLLM registers it only for models of its task
            raise HTTPException(404, f"{request.url.path} is not served: the model {served!r} does not do its task")
        raise HTTPException(404)

    return not_served


def _model_source(report: StartupReport) -> dict[str, Any] | None:
    """Where the served weights come from, when the engine loads a converted copy (a GGUF file)."""
    gguf = report.model.gguf if report.model else None
    if gguf is None:
        return None
    return {
        "format": "gguf",
        "file": gguf.path,
        "sha256": gguf.sha256,
        "architecture": gguf.architecture,
        "tensor_types": dict(gguf.tensor_types),
        "served_dtype": report.plan.engine_args.get("dtype"),
    }


def _service_handlers(
    app: FastAPI,
    report: StartupReport,
    lifecycle: Lifecycle,
    metrics: ServiceMetrics,
    demo: bool,
    aliases: tuple[str, ...],
) -> dict[str, Callable[..., Any]]:
    hardware = report.to_dict()
    versions = {
        "service": report.software.service,
        "vllm": report.software.vllm,
        "torch": report.software.torch,
        "zentorch": report.software.zentorch,
    }

    async def health() -> Response:
        """Liveness: 200 while the process and the engine are alive (also while loading), 503 once dead."""
        if lifecycle.phase is Phase.DEAD:
            return JSONResponse({"status": "dead", "reason": without_paths(lifecycle.reason)}, status_code=503)
        if lifecycle.engine is not None:
            try:
                await lifecycle.engine.check_health()
            except Exception as exc:  # EngineDeadError and whatever a dead core raises
                if lifecycle.engine_errored:
                    lifecycle.engine_died()
                else:
                    lifecycle.set_phase(Phase.DEAD, f"engine health check failed: {exc}")
                return JSONResponse({"status": "dead", "reason": without_paths(lifecycle.reason)}, status_code=503)
        return JSONResponse({"status": "alive", "phase": lifecycle.phase.value})

    async def ready() -> Response:
        """Readiness: 200 only once the model is loaded and a warm-up generation succeeded."""
        status = 200 if lifecycle.phase is Phase.READY else 503
        return JSONResponse(
            {"status": lifecycle.phase.value, "reason": without_paths(lifecycle.reason)}, status_code=status
        )

    async def version() -> dict[str, Any]:
        return versions

    async def v1_hardware() -> dict[str, Any]:
        """The startup report: facts, backend, decisions with reasons, warnings, errors; for a GGUF file, the
        engine's check against llama.cpp once it has run; the prefix cache's hit rate since start."""
        live = {"prefix_cache": metrics.prefix_cache()}
        return (
            hardware | live if lifecycle.gguf_check is None else hardware | live | {"gguf_check": lifecycle.gguf_check}
        )

    async def prometheus_metrics() -> Response:
        metrics.in_flight.set(lifecycle.in_flight)
        if (models := getattr(app.state, "openai_serving_models", None)) is not None:  # once the engine is up
            metrics.lora_adapters.set(len(models.lora_requests))
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    source = _model_source(report)

    async def cards(request: Request) -> dict[str, Any]:
        listing = await request.app.state.openai_serving_models.show_available_models()
        body = listing.model_dump()
        for card in body["data"]:
            if card.get("parent"):  # a LoRA adapter: its own weights, on the base model's card
                continue
            if demo:
                card.update(demo=True, description=_DEMO_DESCRIPTION)
            if source:
                card.update(source=source)
            if aliases:
                card.update(aliases=list(aliases))
        return body

    async def v1_models(request: Request) -> Response:
        return JSONResponse(await cards(request))

    async def v1_model(request: Request, model: str) -> Response:
        listing = await cards(request)
        card = next((c for c in listing["data"] if c["id"] == model), None)
        if card is None and aliases:  # an alias names the served model, the first card
            served = ModelAliases(listing["data"][0]["id"], aliases)
            card = listing["data"][0] if served.resolve(model) else None
        if card is None:
            served = ", ".join(c["id"] for c in listing["data"])
            raise ServiceError(
                HTTPStatus.NOT_FOUND,
                f"The model `{model}` does not exist. Valid aliases: {served}.",
                "NotFoundError",
                param="model",
            )
        return JSONResponse(card)

    async def openapi() -> Response:
        """Every route this port serves (vLLM's once the engine is up)."""
        return JSONResponse(app.openapi())

    return {
        "/health": health,
        "/ready": ready,
        "/version": version,
        "/metrics": prometheus_metrics,
        "/v1/hardware": v1_hardware,
        "/openapi.json": openapi,
        "/v1/models": v1_models,
        "/v1/models/{model:path}": v1_model,
    }
