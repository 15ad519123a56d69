"""Every path this port serves, in one table: who may call it and what it needs.

vLLM's app defines many more routes (operator controls such as elastic scaling, profiling, sleep, weight
updates, render/derender); only those listed in ENGINE_ROUTES are served, so a new vLLM release cannot expose an
operator route by default. Anthropic's Messages API answers errors in Anthropic's shape (anthropic_errors.py),
every other route in OpenAI's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.server.http import lora_routes, service_handlers


class Access(enum.Enum):
    PROBE = "probe"  # liveness / readiness: no key, their own status bodies, every phase
    METRICS = "metrics"  # no key unless metrics_require_auth: what a scraper and a dashboard read
    SERVICE = "service"  # the key; answered by the service at every phase
    ENGINE = "engine"  # the key, and a ready engine (503 + Retry-After while starting or draining)


@dataclass(frozen=True)
class Route:
    """One of the service's own routes: create_app serves the table as it stands."""

    method: str
    path: str
    access: Access
    handler: Callable[..., Any]
    in_schema: bool = True  # listed in /openapi.json
    json_body: bool = False  # a POST body sent as JSON, or 400 saying so (as vLLM's POST routes)
    lora: bool = False  # served only with the lora_dir setting


# Loading and unloading LoRA adapters while serving (lora_routes.py): vLLM's request bodies, only with lora_dir.
LOAD_LORA, UNLOAD_LORA = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", Access.PROBE, service_handlers.health),
    Route("GET", "/ready", Access.PROBE, service_handlers.ready),
    Route("GET", "/version", Access.METRICS, service_handlers.version),
    Route("GET", "/metrics", Access.METRICS, service_handlers.prometheus_metrics),
    Route("GET", "/v1/hardware", Access.SERVICE, service_handlers.hardware),
    Route("GET", "/openapi.json", Access.SERVICE, service_handlers.openapi, in_schema=False),
    Route("GET", "/v1/models", Access.ENGINE, service_handlers.models),
    # OpenAI's "retrieve model" (`client.models.retrieve`); `path` because Hugging Face ids hold a slash.
    Route("GET", "/v1/models/{model:path}", Access.ENGINE, service_handlers.model),
    Route("POST", LOAD_LORA, Access.ENGINE, lora_routes.load, json_body=True, lora=True),
    Route("POST", UNLOAD_LORA, Access.ENGINE, lora_routes.unload, json_body=True, lora=True),
)
# The paths the service answers itself at every start, and who may call them.
SERVICE_ROUTES: dict[str, Access] = {r.path: r.access for r in ROUTES if not r.lora}
LORA_ROUTES: frozenset[str] = frozenset(r.path for r in ROUTES if r.lora)

# vLLM's routes for pooling models: a JSON body that names its model.
POOLING_ROUTES: frozenset[str] = frozenset(
    {
        "/v1/embeddings",
        "/v2/embed",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
    }
)

# vLLM's routes that are served (Access.ENGINE), each only where the model supports it (vLLM registers the
# pooling routes for pooling models, the generation routes for generative ones).
ENGINE_ROUTES: frozenset[str] = POOLING_ROUTES | frozenset(
    {
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/completions",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/cancel",
        # Anthropic's Messages API (Claude Code and the anthropic SDK).
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/tokenize",
        "/detokenize",
        # Amazon SageMaker's serving contract.
        "/ping",
        "/invocations",
    }
)

# Not counted in the HTTP request metrics: probes every few seconds and the scrape itself would drown the rest.
UNCOUNTED = tuple(path for path, access in SERVICE_ROUTES.items() if access in (Access.PROBE, Access.METRICS))


def served_engine_route(path: str) -> bool:
    """Whether a route of vLLM's app is served (the service's own routes take precedence)."""
    return path in ENGINE_ROUTES and path not in SERVICE_ROUTES
