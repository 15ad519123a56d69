"""The handlers of the service's own routes (routes.py lists them with their paths and access). Each reads what it
answers from the app's `ServiceState`, which create_app puts in `app.state.service`."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from service.server.http.metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from service.server.http.redact import without_paths
from service.server.openai_compat.errors import ServiceError
from service.server.openai_compat.model_aliases import ModelAliases
from service.server.supervision.lifecycle import Lifecycle, Phase
from service.startup.report import StartupReport

DEMO_DESCRIPTION = (
    "built-in demo model with random weights: it answers gibberish; set SERVICE_MODEL to serve a real model"
)


@dataclass(frozen=True)
class ServiceState:
    """What the service's own routes answer from: the startup report, the engine's lifecycle, the metrics."""

    report: dict[str, Any]  # the startup report as /v1/hardware gives it
    versions: dict[str, str | None]
    lifecycle: Lifecycle
    metrics: ServiceMetrics
    demo: bool
    aliases: tuple[str, ...]
    source: dict[str, Any] | None  # where the served weights come from, when the engine loads a converted copy

    @classmethod
    def of(
        cls, report: StartupReport, lifecycle: Lifecycle, metrics: ServiceMetrics, demo: bool, aliases: tuple[str, ...]
    ) -> ServiceState:
        s = report.software
        return cls(
            report.to_dict(),
            {"service": s.service, "vllm": s.vllm, "torch": s.torch, "zentorch": s.zentorch},
            lifecycle,
            metrics,
            demo,
            aliases,
            _model_source(report),
        )


def _model_source(report: StartupReport) -> dict[str, Any] | None:
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


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


async def health(request: Request) -> Response:
    """Liveness: 200 while the process and the engine are alive (also while loading), 503 once dead."""
    lifecycle = _state(request).lifecycle
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


async def ready(request: Request) -> Response:
    """Readiness: 200 only once the model is loaded and a warm-up generation succeeded."""
    lifecycle = _state(request).lifecycle
    status = 200 if lifecycle.phase is Phase.READY else 503
    return JSONResponse(
        {"status": lifecycle.phase.value, "reason": without_paths(lifecycle.reason)}, status_code=status
    )


async def version(request: Request) -> dict[str, Any]:
    return _state(request).versions


async def hardware(request: Request) -> dict[str, Any]:
    """The startup report: facts, backend, decisions with reasons, warnings, errors; for a GGUF file, the engine's
    check against llama.cpp once it has run; the prefix cache's hit rate since start."""
    state = _state(request)
    answer = state.report | {"prefix_cache": state.metrics.prefix_cache()}
    check = state.lifecycle.gguf_check
    return answer if check is None else answer | {"gguf_check": check}


async def prometheus_metrics(request: Request) -> Response:
    state = _state(request)
    state.metrics.in_flight.set(state.lifecycle.in_flight)
    if (models := getattr(request.app.state, "openai_serving_models", None)) is not None:  # once the engine is up
        state.metrics.lora_adapters.set(len(models.lora_requests))
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def _cards(request: Request) -> dict[str, Any]:
    state = _state(request)
    listing = await request.app.state.openai_serving_models.show_available_models()
    body: dict[str, Any] = listing.model_dump()
    for card in body["data"]:
        if card.get("parent"):  # a LoRA adapter: its own weights, on the base model's card
            continue
        if state.demo:
            card.update(demo=True, description=DEMO_DESCRIPTION)
        if state.source:
            card.update(source=state.source)
        if state.aliases:
            card.update(aliases=list(state.aliases))
    return body


async def models(request: Request) -> Response:
    return JSONResponse(await _cards(request))


async def model(request: Request, model: str) -> Response:
    listing = await _cards(request)
    aliases = _state(request).aliases
    card = next((c for c in listing["data"] if c["id"] == model), None)
    if card is None and aliases:  # an alias names the served model, the first card
        served = ModelAliases(listing["data"][0]["id"], aliases)
        card = listing["data"][0] if served.resolve(model) else None
    if card is None:
        ids = ", ".join(c["id"] for c in listing["data"])
        raise ServiceError(
            HTTPStatus.NOT_FOUND,
            f"The model `{model}` does not exist. Valid aliases: {ids}.",
            "NotFoundError",
            param="model",
        )
    return JSONResponse(card)


async def openapi(request: Request) -> Response:
    """Every route this port serves (vLLM's once the engine is up)."""
    return JSONResponse(request.app.openapi())
