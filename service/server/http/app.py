"""The HTTP shell: one FastAPI app serving the route table (routes.py), vLLM's listed routes included into it
once the engine is up, the API key and engine admission as dependencies, one set of error handlers."""

from __future__ import annotations

import copy
import functools
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Match
from vllm.entrypoints.serve.utils.api_utils import validate_json_request

from service.facts.api_key import api_key_of
from service.policy.exposure.access import checked_host_names
from service.server.http.admission import Bounds, engine_admission
from service.server.http.auth import require_api_key
from service.server.http.body_limit import BodyLimitMiddleware
from service.server.http.host_check import HostCheckMiddleware
from service.server.http.lora_routes import OFF, AdapterLoader
from service.server.http.metrics import ServiceMetrics
from service.server.http.request_cap import RESERVED_REQUESTS, RequestCapMiddleware, request_limit
from service.server.http.request_id import RequestIdMiddleware
from service.server.http.routes import ENGINE_ROUTES, LORA_ROUTES, ROUTES, UNCOUNTED, Access, served_engine_route
from service.server.http.service_handlers import ServiceState
from service.server.openai_compat.anthropic_errors import AnthropicErrorsMiddleware
from service.server.openai_compat.engine_responses import engine_endpoint
from service.server.openai_compat.errors import install_error_handlers
from service.server.openai_compat.model_aliases import ModelAliases
from service.server.openai_compat.output_limit import OutputBound
from service.server.supervision.lifecycle import Lifecycle
from service.settings import Settings
from service.startup.report import StartupReport

_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
# Pages on this machine may call the API from a browser, as Ollama allows by default; other pages only when listed
# (cors_origins): without an API key, the default, any page the user opens could otherwise use the model.
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


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
    app.state.service = ServiceState.of(report, lifecycle, metrics, demo, tuple(settings.model_aliases))
    install_error_handlers(app, on_engine_dead=lifecycle.engine_died)
    key = api_key_of(settings).value
    app.openapi = functools.partial(_openapi, app, key)  # type: ignore[method-assign]
    rank = report.plan.engine_args.get("max_lora_rank")
    if settings.lora_dir is not None and report.model is not None and rank:
        app.state.lora_loader = AdapterLoader(settings.lora_dir, report.model, rank)
    dependencies = _dependencies(app, settings, report, lifecycle, served_model, key)
    for route in ROUTES:
        if route.lora and getattr(app.state, "lora_loader", None) is None:
            continue
        json_body = [Depends(validate_json_request)] if route.json_body else []
        depends = dependencies[route.access] + json_body
        app.add_api_route(
            route.path, route.handler, methods=[route.method], dependencies=depends, include_in_schema=route.in_schema
        )
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
    attach = functools.partial(_attach_engine, app, catch_all, dependencies[Access.ENGINE], lifecycle, settings)
    Instrumentator(excluded_handlers=list(UNCOUNTED), registry=metrics.registry).instrument(app)
    add_gates(app, settings, frozenset(UNCOUNTED))
    return HttpShell(app, attach)


def _dependencies(
    app: FastAPI, settings: Settings, report: StartupReport, lifecycle: Lifecycle, served: str, key: str | None
) -> dict[Access, list[Any]]:
    """What each access level asks of a request before its handler runs."""
    needs_key = Depends(require_api_key(key))
    admission = engine_admission(
        lifecycle, settings.max_queued_requests, report.model, _bounds(settings, report, served)
    )
    loader: AdapterLoader | None = getattr(app.state, "lora_loader", None)
    return {
        Access.PROBE: [],
        Access.METRICS: [needs_key] if settings.metrics_require_auth else [],
        Access.SERVICE: [needs_key],
        Access.ENGINE: [needs_key, Depends(admission)] + ([Depends(loader.load_on_first_use)] if loader else []),
    }


def _openapi(app: FastAPI, key: str | None) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        if key:
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
        app.openapi_schema = schema
    return app.openapi_schema


def _attach_engine(
    app: FastAPI,
    catch_all: APIRoute,
    engine_dependencies: list[Any],
    lifecycle: Lifecycle,
    settings: Settings,
    vllm_app: FastAPI,
) -> None:
    """Serve the listed routes of the app vLLM built, before the catch-all."""
    router = APIRouter()
    router.routes.extend(
        _wrapped(r, lifecycle, settings.request_timeout)
        for r in vllm_app.routes
        if isinstance(r, APIRoute) and served_engine_route(r.path)
    )
    app.router.routes.remove(catch_all)
    app.include_router(router, dependencies=engine_dependencies)
    app.router.routes.append(catch_all)
    app.openapi_schema = None  # rebuilt with vLLM's routes (run.py does it before /ready: seconds of CPU)


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
