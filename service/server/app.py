"""FastAPI factory: the service's own routes, middleware, and vLLM's OpenAI app behind them once it is up."""
from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.routing import Mount
from starlette.types import Message, Receive, Scope, Send

from service.report import StartupReport
from service.server.errors import openai_error
from service.server.lifecycle import Lifecycle, Phase
from service.server.metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from service.server.middleware import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    EngineGateMiddleware,
    ErrorShapeMiddleware,
    StreamStartErrorMiddleware,
)
from service.settings import Settings


# Operator controls in vLLM's app (cluster scaling, profiling, sleep, weight updates, RL pause/resume...):
# not for API clients. Most exist only with dev/profiling/LoRA flags the service never sets; the elastic-EP
# pair is always there. The service answers 404 for them and leaves them out of its schema.
ENGINE_CONTROL_PATHS = frozenset(
    {
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/start_profile",
        "/stop_profile",
        "/server_info",
        "/reset_prefix_cache",
        "/reset_mm_cache",
        "/reset_encoder_cache",
        "/collective_rpc",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/release_kv_cache_memory",
        "/pause",
        "/resume",
        "/is_paused",
        "/abort_requests",
        "/init_weight_transfer_engine",
        "/shutdown_weight_transfer_engine",
        "/start_weight_update",
        "/start_draft_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/update_weight_version",
        "/weight_info",
        "/weight_checker",
        "/get_world_size",
        "/fault_tolerance/apply",
        "/fault_tolerance/status",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
    }
)


SERVICE_PATHS = frozenset({"/health", "/ready", "/version", "/v1/hardware", "/metrics", "/v1/models"})
ENDPOINT_UNSUPPORTED = "The model does not support"


def _not_implemented_as_client_error(send: Send) -> Send:
    """vLLM answers 501 when the request asks for something this deployment does not do: an endpoint the
    model cannot serve ("The model does not support Embeddings API", ...) or an unimplemented option. That is
    the client's request, not a server fault: 404 for the endpoint, 400 for an option (OpenAI's API never
    answers 501, and 5xx would page whoever watches the error rate)."""
    held: Message | None = None
    chunks: list[bytes] = []

    async def wrapped(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and message["status"] == HTTPStatus.NOT_IMPLEMENTED:
            held = message
            return
        if held is None:
            return await send(message)
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        try:
            error = json.loads(b"".join(chunks))["error"]
            text = str(error["message"])
        except (ValueError, KeyError, TypeError):
            text = b"".join(chunks).decode("utf-8", errors="replace") or "not implemented"
        if text.startswith(ENDPOINT_UNSUPPORTED):
            status, err_type = HTTPStatus.NOT_FOUND, "NotFoundError"
        else:
            status, err_type = HTTPStatus.BAD_REQUEST, "BadRequestError"
        response = openai_error(status, text, err_type)
        headers = [(k, v) for k, v in response.raw_headers]
        await send({"type": "http.response.start", "status": int(status), "headers": headers})
        await send({"type": "http.response.body", "body": response.body, "more_body": False})

    return wrapped


class EngineApp:
    """Forwards to vLLM's app once it exists. Exposes that app's routes so the HTTP metrics label requests
    by their real route (/v1/chat/completions), not by this mount."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle

    @property
    def routes(self) -> list[Any]:
        app = self.lifecycle.engine_app
        return list(app.routes) if app is not None else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.lifecycle.engine_app
        if app is None:
            response = openai_error(HTTPStatus.SERVICE_UNAVAILABLE, self.lifecycle.reason, "ServiceUnavailableError")
            return await response(scope, receive, send)
        path = scope.get("path")
        if path in ENGINE_CONTROL_PATHS:
            response = openai_error(HTTPStatus.NOT_FOUND, "Not Found", "NotFoundError")
            return await response(scope, receive, send)
        if path in SERVICE_PATHS:  # the service's own route, reached here only with another method
            response = openai_error(HTTPStatus.METHOD_NOT_ALLOWED, "Method Not Allowed", "MethodNotAllowedError")
            return await response(scope, receive, send)
        await app(scope, receive, _not_implemented_as_client_error(send))


def merged_openapi(app: FastAPI, engine_app: Any, *, bearer: bool) -> dict[str, Any]:
    """The service's routes plus vLLM's (the service's own answer where both define a path): the one schema
    a client (or a fuzzer) needs for everything this port serves."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    if engine_app is not None:
        engine_schema = engine_app.openapi()
        for path, item in engine_schema.get("paths", {}).items():
            if path not in ENGINE_CONTROL_PATHS:
                schema["paths"].setdefault(path, item)
        for kind, items in engine_schema.get("components", {}).items():
            schema.setdefault("components", {}).setdefault(kind, {})
            for name, item in items.items():
                schema["components"][kind].setdefault(name, item)
    if bearer:
        schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
    return schema


def create_app(
    settings: Settings,
    report: StartupReport,
    lifecycle: Lifecycle,
    metrics: ServiceMetrics,
    *,
    served_model: str,
    demo: bool,
) -> FastAPI:
    app = FastAPI(title="CPU LLM service", version=report.software.service or "unknown")
    hardware = report.to_dict()
    versions = {
        "service": report.software.service,
        "vllm": report.software.vllm,
        "torch": report.software.torch,
        "zentorch": report.software.zentorch,
    }

    @app.get("/health")
    async def health() -> Response:
        """Liveness: 200 while the process and the engine are alive (also while loading), 503 once dead."""
        if lifecycle.phase is Phase.DEAD:
            return JSONResponse({"status": "dead", "reason": lifecycle.reason}, status_code=503)
        if lifecycle.engine is not None:
            try:
                await lifecycle.engine.check_health()
            except Exception as exc:  # EngineDeadError and whatever a dead core raises
                lifecycle.set_phase(Phase.DEAD, f"engine health check failed: {exc}")
                return JSONResponse({"status": "dead", "reason": lifecycle.reason}, status_code=503)
        return JSONResponse({"status": "alive", "phase": lifecycle.phase.value})

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 200 only once the model is loaded and a warm-up generation succeeded."""
        status = 200 if lifecycle.phase is Phase.READY else 503
        return JSONResponse({"status": lifecycle.phase.value, "reason": lifecycle.reason}, status_code=status)

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return versions

    @app.get("/v1/hardware")
    async def v1_hardware() -> dict[str, Any]:
        """The startup report: facts, backend, decisions with reasons, warnings, errors."""
        return hardware

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        metrics.in_flight.set(lifecycle.in_flight)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def v1_models() -> Response:
        listing = await lifecycle.engine_app.state.openai_serving_models.show_available_models()
        body = listing.model_dump()
        if demo:
            for card in body["data"]:
                card["demo"] = True
                card["description"] = (
                    "built-in demo model with random weights: it answers gibberish; "
                    "set SERVICE_MODEL to serve a real model"
                )
        return JSONResponse(body)

    app.router.routes.append(Mount("", app=EngineApp(lifecycle)))

    key = settings.resolved_api_key()

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = merged_openapi(app, lifecycle.engine_app, bearer=bool(key))
        if lifecycle.engine_app is not None:  # complete: keep it
            app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

    app.add_middleware(StreamStartErrorMiddleware)
    app.add_middleware(EngineGateMiddleware, lifecycle=lifecycle)
    if key:
        app.add_middleware(ApiKeyMiddleware, key=key, protect_metrics=settings.metrics_require_auth)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(ErrorShapeMiddleware)
    Instrumentator(excluded_handlers=["/metrics", "/health", "/ready"], registry=metrics.registry).instrument(app)
    return app
