"""vLLM's AsyncLLM in-process, the app vLLM builds for it (routes, protocol), and the warm-up request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from argparse import Namespace
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from service.in_vllm.contract import WORKER_START_ENV
from service.in_vllm.worker_start import fork_engine_core

log = logging.getLogger("service.engine")
T = TypeVar("T")


class EngineDied(Exception):
    """The engine died during a step of the start that waited on it."""

    def __init__(self, engine: Any) -> None:
        super().__init__("the engine died while the service set it up")
        self.engine = engine


DEAD_POLL_S = 0.25  # vLLM marks a dead engine with a flag, not an event


async def unless_dead(engine: Any, step: Awaitable[T]) -> T:
    """`step`, given up as soon as vLLM marks the engine dead. A utility call or request the engine core had not
    answered when it died waits for ever (vLLM fails only the calls made after): an engine core that died just
    after its handshake, as its worker was killed, held the start in "starting" with nothing left to wait for."""
    task = asyncio.ensure_future(step)
    try:
        while not (await asyncio.wait({task}, timeout=DEAD_POLL_S))[0]:
            if engine.errored:
                raise EngineDied(engine)
        return task.result()
    finally:
        task.cancel()


class EngineConfigRefused(Exception):
    """vLLM refused the engine configuration (an architecture it does not have, a limit the model cannot take) or
    the model's tokenizer before starting any process, or the model directory has no weights vLLM would load: the
    start is refused, as the service's own checks refuse one."""


# What vLLM's default loader globs for in a local model directory (DefaultModelLoader._prepare_weights, load
# format "auto"): finding none, it failed in the worker, after the processes had started.
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


def missing_weights(model: str, load_format: str) -> str | None:
    """Why a local model directory cannot load: it holds none of the files vLLM's loader looks for. None when it
    has some, when the model is not a local directory, or when another load format decides what to read."""
    directory = Path(model)
    if load_format != "auto" or not directory.is_dir():
        return None
    if any(next(directory.glob(pattern), None) is not None for pattern in _WEIGHT_PATTERNS):
        return None
    return (
        f"{directory} holds no weights: vLLM looks there for {', '.join(_WEIGHT_PATTERNS)} files and finds none "
        "(a copy or download of the config and tokenizer alone?)"
    )


def _config_problem(exc: ValueError) -> str:
    # pydantic's text ends with its documentation link and repeats the class; its errors' messages are the point.
    errors = getattr(exc, "errors", None)
    return "; ".join(str(e["msg"]) for e in errors()) if callable(errors) else str(exc)


def _flag(name: str, value: Any) -> list[str]:
    opt = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [opt if value else "--no-" + opt[2:]]
    if isinstance(value, dict):  # vLLM parses config flags as JSON
        return [opt, json.dumps(value)]
    if isinstance(value, list):  # one flag, several values (vLLM's --lora-modules takes each as JSON)
        return [opt, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)]
    return [opt, str(value)]


def engine_flags(engine_args: dict[str, Any]) -> list[str]:
    """The policy's engine arguments as vLLM CLI flags (the service's own start and the bench's vLLM server)."""
    return [part for name, value in engine_args.items() for part in _flag(name, value)]


def vllm_args(engine_args: dict[str, Any], model: str, served_name: str, max_queued: int) -> Namespace:
    """vLLM's own serve arguments (its parser supplies every front-end default), from the policy's choices."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", model, "--served-model-name", served_name, *engine_flags(engine_args)]
    if max_queued:
        argv += ["--max-num-queued-reqs", str(max_queued)]
    # The service answers /metrics, /health and auth itself; uvicorn's access log would double ours.
    argv += ["--disable-uvicorn-access-log"]
    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


async def start_engine(args: Namespace, state: Any, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
    """Returns (engine client, the app vLLM builds for it, whose routes the service serves). The serving
    objects vLLM's routes use are set up in `state`, the service app's own. AsyncLLM's constructor blocks for
    the whole engine start-up (process spawn, model load), so it runs in a thread while the event loop keeps
    answering probes."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.tokenizers.registry import cached_tokenizer_from_config
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from service.server.supervision.stat_logger import prometheus_stat_logger

    engine_args = AsyncEngineArgs.from_cli_args(args)
    # A custom stat logger turns stats on even where they were turned off, so it is given only where they are on.
    stat_loggers = None if engine_args.disable_log_stats else [prometheus_stat_logger()]

    def construct() -> AsyncLLM:
        try:
            config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        except ValueError as exc:  # pydantic's ValidationError is one
            raise EngineConfigRefused(f"vLLM refuses the engine configuration: {_config_problem(exc)}") from exc
        if (problem := missing_weights(config.model_config.model, config.load_config.load_format)) is not None:
            raise EngineConfigRefused(problem)
        try:  # what AsyncLLM does first, before any process; cached by vLLM, so AsyncLLM's own call reuses it
            cached_tokenizer_from_config(config.model_config)
        except (ValueError, OSError) as exc:  # transformers' "Couldn't instantiate the backend tokenizer", a bad file
            raise EngineConfigRefused(
                f"the tokenizer of {config.model_config.tokenizer} cannot be loaded: {' '.join(str(exc).split())} "
                "(a model directory needs its tokenizer files: tokenizer.json or the files its tokenizer_config.json "
                "names)"
            ) from exc
        if (started := fork_engine_core(os.environ.get(WORKER_START_ENV) == "fork")).startswith("spawn"):
            log.warning("the engine core is spawned, not forked as decided: %s", started)
        return AsyncLLM.from_vllm_config(
            vllm_config=config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            enable_log_requests=engine_args.enable_log_requests,
            disable_log_stats=engine_args.disable_log_stats,
            stat_loggers=stat_loggers,
        )

    # [agents, issue 12] vLLM's own server imports --tool-parser-plugin at start (launcher.setup_server);
    # the service builds the app itself, so it does the same (the forced_only parser, service/policy/engine/chat.py).
    if args.tool_parser_plugin:
        from vllm.tool_parsers import ToolParserManager

        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    engine = await asyncio.to_thread(construct)
    stack.callback(engine.shutdown)
    supported = await unless_dead(engine, engine.get_supported_tasks())
    vllm_app = build_app(args, supported, engine.model_config)
    await unless_dead(engine, init_app_state(engine, state, args, supported))
    return engine, vllm_app


@contextlib.asynccontextmanager
async def serving_lifespan(app: Any) -> AsyncIterator[int]:
    """vLLM's own server lifespan around the service's serving time, entered once the engine is warm: it logs
    the engine's stats every VLLM_LOG_STATS_INTERVAL seconds (the "Avg prompt throughput ... Running: N reqs"
    line), shuts the audio serving objects down at the end, and freezes the start-up heap out of the garbage
    collector. Without the freeze a full collection walked the ~700 000 objects torch, transformers and vLLM left at
    start-up while serving: a 0.5 s pause, +2 ms API CPU per request in the c=16 load it fell in (docs/benchmarks.md).
    Yields the frozen object count."""
    import gc

    from vllm.entrypoints.launchers.utils.server_utils import lifespan

    async with lifespan(app):
        yield gc.get_freeze_count()


def cache_vllm_environment() -> None:
    """From here on vLLM reads its environment variables from a cache, as its engine-core and worker processes do
    once started: uncached, every read parses os.environ again, and the API process reads one (whether to count NaNs
    in logits) for every token and every engine step (claim/stat-logger-api-cpu/zen5). The service sets its
    environment before the engine starts and never after."""
    from vllm import envs

    envs.enable_envs_cache()


async def warm_up(app: Any, served_name: str, embedding: bool, headers: dict[str, str]) -> None:
    """One real request through the service's own route, in-process: proves tokenizer, engine and kernels
    work end to end."""
    transport = httpx.ASGITransport(app=app)
    # Host localhost: a keyless service answers only local names (server/host_check.py).
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost", headers=headers) as client:
        if embedding:
            resp = await client.post("/v1/embeddings", json={"model": served_name, "input": "warm up"})
        else:
            resp = await client.post(
                "/v1/completions", json={"model": served_name, "prompt": "warm up", "max_tokens": 2}
            )
    if resp.status_code != 200:
        raise RuntimeError(f"warm-up request failed with {resp.status_code}: {resp.text[:500]}")
