"""Start vLLM's AsyncLLM in-process and build vLLM's own OpenAI app on it (routes, protocol, errors)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from argparse import Namespace
from typing import Any

import httpx

log = logging.getLogger("service.engine")


def _flag(name: str, value: Any) -> list[str]:
    opt = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [opt if value else "--no-" + opt[2:]]
    return [opt, str(value)]


def vllm_args(engine_args: dict[str, Any], model: str, served_name: str, max_queued: int) -> Namespace:
    """vLLM's own serve arguments (its parser supplies every front-end default), from the policy's choices."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", model, "--served-model-name", served_name]
    for name, value in engine_args.items():
        argv += _flag(name, value)
    if max_queued:
        argv += ["--max-num-queued-reqs", str(max_queued)]
    # The service answers /metrics, /health and auth itself; uvicorn's access log would double ours.
    argv += ["--disable-uvicorn-access-log"]
    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


def _strip_http_instrumentation(app: Any) -> None:
    """vLLM instruments its app with prometheus-fastapi-instrumentator; the service instruments the outer app
    with the same library (so 401/413/503 answered before vLLM count too). Two would register the same
    metric names twice."""
    from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware

    app.user_middleware = [m for m in app.user_middleware if m.cls is not PrometheusInstrumentatorMiddleware]


def bound_admission(engine: Any) -> None:
    """vLLM answers 503 (retry later) when a request would overflow --max-num-queued-reqs, also for one that
    needs more sequences (n, items, questions) than the limit itself: it could never be admitted, so retrying
    is pointless. Such a request gets 400 naming both numbers instead."""
    from vllm.exceptions import VLLMValidationError

    limit = engine.scheduler_config.max_num_queued_reqs
    if limit is None:
        return
    check = engine.check_admission

    def check_admission(n: int = 1, request_id: str | None = None) -> None:
        if n > limit:
            raise VLLMValidationError(
                f"this request needs {n} sequences but the server admits at most {limit} at a time "
                "(max_queued_requests): ask for fewer"
            )
        check(n, request_id)

    engine.check_admission = check_admission


class _ShutdownOwnedByWatchdog:
    """Stands in for the uvicorn server vLLM's engine-error handler expects at `app.state.server` (it sets
    `should_exit` when the engine is dead). The service's watchdog owns that exit: /health turns 503 first
    and the process exits non-zero, so nothing here stops the server."""

    should_exit = False


async def start_engine(args: Namespace, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
    """Returns (engine client, vLLM app). AsyncLLM's constructor blocks for the whole engine start-up
    (process spawn, model load), so it runs in a thread while the event loop keeps answering probes."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs.from_cli_args(args)

    def construct() -> AsyncLLM:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        return AsyncLLM.from_vllm_config(
            vllm_config=config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            enable_log_requests=engine_args.enable_log_requests,
            disable_log_stats=engine_args.disable_log_stats,
        )

    engine = await asyncio.to_thread(construct)
    stack.callback(engine.shutdown)
    bound_admission(engine)
    supported = await engine.get_supported_tasks()
    app = build_app(args, supported, engine.model_config)
    app.state.server = _ShutdownOwnedByWatchdog()
    _strip_http_instrumentation(app)
    await init_app_state(engine, app.state, args, supported)
    return engine, app


async def warm_up(app: Any, served_name: str, embedding: bool) -> None:
    """One real request through vLLM's own route: proves tokenizer, engine and kernels work end to end."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://warmup") as client:
        if embedding:
            resp = await client.post("/v1/embeddings", json={"model": served_name, "input": "warm up"})
        else:
            resp = await client.post(
                "/v1/completions", json={"model": served_name, "prompt": "warm up", "max_tokens": 2}
            )
    if resp.status_code != 200:
        raise RuntimeError(f"warm-up request failed with {resp.status_code}: {resp.text[:500]}")
