"""FastAPI factory: the service's own routes, middleware, and vLLM's OpenAI app behind them once it is up."""
from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from service.report import StartupReport
from service.server.errors import openai_error
from service.server.lifecycle import Lifecycle, Phase
from service.server.metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from service.server.middleware import ApiKeyMiddleware, BodyLimitMiddleware, EngineGateMiddleware
from service.settings import Settings


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
        await app(scope, receive, send)


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

    app.add_middleware(EngineGateMiddleware, lifecycle=lifecycle)
    key = settings.resolved_api_key()
    if key:
        app.add_middleware(ApiKeyMiddleware, key=key, protect_metrics=settings.metrics_require_auth)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    Instrumentator(excluded_handlers=["/metrics", "/health", "/ready"], registry=metrics.registry).instrument(app)
    return app
