"""`python -m service serve`: startup hook first (before any vLLM process exists), then HTTP + engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
import uvloop

from service.facts.api_key import api_key_of
from service.server.supervision.draining_server import DrainingServer
from service.server.supervision.engine_death import alive, death_cause, oom_note
from service.server.supervision.engine_processes import (
    end_engine_start,
    engine_processes,
    stop_leftover_engine_processes,
)
from service.server.supervision.lifecycle import EXIT_ENGINE_DIED, EXIT_STARTUP_REFUSED, Lifecycle, Phase
from service.server.supervision.watchdog import note_a_death_while_stopping, watch_engine, watch_start
from service.settings import Settings
from service.startup.report import StartupReport
from service.startup.self_preload import restore_user_preload
from service.startup.sequence import StartRefused, decide_start, listen, prepare, refuse_unsafe

if TYPE_CHECKING:  # vLLM is imported only once the startup has set its environment (_serve)
    from service.server.http.app import HttpShell
    from service.server.http.metrics import ServiceMetrics

log = logging.getLogger("service")


def run(settings: Settings) -> int:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The service's logger carries its own level: the root logger ends up at ERROR once the engine has started
    # (a library raises it), which silenced "ready", "received SIGTERM: draining" and friends.
    logging.getLogger("service").setLevel(settings.log_level.upper())
    if settings.models:
        from service.server.router.run import run_table

        try:
            refuse_unsafe(settings)
            return run_table(settings, lambda: listen(settings.host, settings.port))
        except StartRefused as exc:
            log.error("refusing to start: %s", exc)
            return EXIT_STARTUP_REFUSED
    reexecuted = restore_user_preload(os.environ)
    user_preload = os.environ.get("LD_PRELOAD")
    started = time.monotonic()
    try:
        report, choice = decide_start(settings, reexecuted, user_preload)
        sock = listen(settings.host, settings.port)
        model = prepare(report, gguf_check=settings.gguf_check != "off")
    except StartRefused as exc:
        log.error("refusing to start: %s", exc)
        return EXIT_STARTUP_REFUSED
    assert report.plan.model is not None
    served = report.plan.model.served_name
    # uvloop, as vLLM's own server uses: the stdlib loop's socket writes cost ~20% more API CPU per request
    # (measured by `make bench`, see README).
    return uvloop.run(_serve(settings, report, model, served, choice.demo, started, sock))


@dataclass
class _Serving:
    """One model's serving, as its parts share it: the settings and plan, the HTTP shell and the engine's lifecycle."""

    settings: Settings
    report: StartupReport
    model: str
    served: str
    started: float
    lifecycle: Lifecycle
    metrics: ServiceMetrics
    shell: HttpShell
    server: DrainingServer
    args: Namespace


async def _serve(
    settings: Settings, report: StartupReport, model: str, served: str, demo: bool, started: float, sock: socket.socket
) -> int:
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    from service.server.http.app import create_app
    from service.server.http.metrics import ServiceMetrics
    from service.server.supervision.engine_start import vllm_args

    lifecycle = Lifecycle(started_at=started)
    metrics = ServiceMetrics(get_prometheus_registry())
    metrics.describe_startup(report, served)
    args = vllm_args(report.plan.engine_args, model, served, settings.max_queued_requests)
    shell = create_app(settings, report, lifecycle, metrics, args, served_model=served, demo=demo)
    server = DrainingServer(_uvicorn_config(settings, shell, metrics), lifecycle, settings.shutdown_grace_seconds)
    serving = _Serving(settings, report, model, served, started, lifecycle, metrics, shell, server, args)
    async with contextlib.AsyncExitStack() as stack:
        engine_task = asyncio.create_task(_bring_up(serving, stack))
        start_watch = asyncio.create_task(watch_start(lifecycle, server, settings.engine_stall_seconds))
        # uvicorn logs its address only for the sockets it binds itself
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        log.info("listening on http://%s:%d: /health and /ready answer while the engine loads", shown, port)
        await server.serve(sockets=[sock])
        metrics.ready.set(0)
        note_a_death_while_stopping(lifecycle)
        if lifecycle.engine is None and not engine_task.done():
            await end_engine_start(engine_task)
        for task in (engine_task, start_watch):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    stop_leftover_engine_processes(lifecycle.engine_processes)
    return lifecycle.exit_code


def _uvicorn_config(settings: Settings, shell: HttpShell, metrics: ServiceMetrics) -> uvicorn.Config:
    from service.server.http.request_head_timeout import HEAD_TIMEOUT_S, head_timeout_protocol

    return uvicorn.Config(
        shell.app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_seconds)),
        # Longer than clients' and load balancers' idle timeouts (httpx 5 s, cloud load balancers 60 s): the client
        # then drops an idle connection first, instead of reusing one the server is closing (a reset request).
        timeout_keep_alive=75,
        # No limit_concurrency: it counts open sockets, so silent ones starved the probes; requests in flight are
        # capped by the app (request_cap.py) and a request head that does not come in time closes its connection.
        http=head_timeout_protocol(HEAD_TIMEOUT_S, metrics.slow_clients.inc),
        lifespan="off",
    )


async def _bring_up(s: _Serving, stack: contextlib.AsyncExitStack) -> None:
    """The engine started, warmed up and checked while the port answers; then watched until the service stops."""
    from service.server.supervision.engine_start import EngineConfigRefused
    from service.server.supervision.gguf_check_run import GgufCheckRefused

    lifecycle = s.lifecycle
    lifecycle.engine_starting()
    try:
        await _start_and_warm(s, stack)
    except Exception as exc:
        if lifecycle.phase is Phase.DRAINING:  # stopped while starting: _end_engine_start stopped its processes
            log.warning("engine start ended by the stop: %s", exc)
            return
        if lifecycle.phase is Phase.DEAD:  # a hung start: _watch_start killed its processes and said why
            log.warning("engine start ended: %s", exc)
            return
        refused = isinstance(exc, (EngineConfigRefused, GgufCheckRefused))
        lifecycle.set_phase(Phase.DEAD, _start_failure(exc, lifecycle, refused))
        lifecycle.exit_code = EXIT_STARTUP_REFUSED if refused else EXIT_ENGINE_DIED
        s.server.should_exit = True
        return
    if lifecycle.phase is Phase.WARMING_UP:
        lifecycle.set_phase(Phase.READY, "model loaded and warmed up")
        s.metrics.ready.set(1)
        s.metrics.startup_seconds.set(time.monotonic() - s.started)
        log.info("ready: serving %r on http://%s:%d", s.served, s.settings.host, s.settings.port)
    await watch_engine(lifecycle, s.server, s.settings.engine_stall_seconds)


async def _start_and_warm(s: _Serving, stack: contextlib.AsyncExitStack) -> None:
    from service.server.openai_compat import client_error_logs
    from service.server.openai_compat.response_models import drop_request_validator
    from service.server.supervision.engine_start import (
        cache_vllm_environment,
        serving_lifespan,
        start_engine,
        unless_dead,
        warm_up,
    )
    from service.server.supervision.gguf_check_run import check_gguf

    lifecycle, app = s.lifecycle, s.shell.app
    lifecycle.engine, vllm_app = await start_engine(s.args, app.state, stack)
    lifecycle.engine_processes = engine_processes()
    s.shell.attach_engine(vllm_app)
    client_error_logs.install()  # vLLM's serving modules are imported by now
    dropped = ", ".join(drop_request_validator()) or "none had it"
    log.info("response models built without vLLM's request-side validator: %s", dropped)
    await asyncio.to_thread(app.openapi)
    lifecycle.set_phase(Phase.WARMING_UP, "engine up, warm-up request running")
    if s.settings.warmup:
        key = api_key_of(s.settings).value
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        embedding = s.report.model is not None and s.report.model.is_embedding
        await unless_dead(lifecycle.engine, warm_up(app, s.served, embedding, headers))
    if s.report.plan.model is not None and s.report.plan.model.conversion is not None:
        check = check_gguf(lifecycle.engine, Path(s.model), s.settings.gguf_check)
        verdict = await unless_dead(lifecycle.engine, check)
        lifecycle.gguf_check = {"passed": verdict.passed, "reason": verdict.reason}
    frozen = await stack.enter_async_context(serving_lifespan(app))
    cache_vllm_environment()
    log.info("froze %d start-up objects out of the garbage collector (as vLLM's own server does)", frozen)


def _start_failure(exc: Exception, lifecycle: Lifecycle, refused: bool) -> str:
    """Why the engine did not start, logged once, as the service's phase will say it."""
    from service.server.supervision.engine_start import EngineDied

    if refused:
        reason = f"refusing to start: {exc}"
        log.error("%s", reason)
    elif isinstance(exc, EngineDied):  # its processes say how; vLLM's traceback is in the log above
        cause = death_cause(exc.engine, lifecycle.engine_processes, lifecycle.oom_kills_since_start())
        reason = f"engine failed to start: {exc}: {cause}"
        log.error("%s", reason)
    elif gone := [proc for proc in lifecycle.engine_processes if not alive(proc)]:
        # vLLM's start failed on a call the dead process could not answer ("Call to get_supported_tasks method
        # failed: cancelled"): the process that ended is the cause.
        reason = f"engine failed to start: {exc}: {death_cause(None, gone, lifecycle.oom_kills_since_start())}"
        log.error("%s", reason)
    else:
        oom = oom_note(lifecycle.oom_kills_since_start())  # a process killed by SIGKILL logs nothing
        reason = f"engine failed to start: {exc}" + (f" ({oom})" if oom else "")
        log.exception("%s", reason)
    return reason
