"""`python -m service serve` with a `models` table: the table planned on this machine (refused as a whole with its
numbers when it does not fit), the front end listening, the pinned models loaded, then each other model on the first
request that names it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Callable

import uvicorn
import uvloop
from fastapi import FastAPI

from service.server.router.app import create_router_app
from service.server.router.child_config import child_settings
from service.server.router.engines import Engine, Engines, NotServed
from service.server.router.router_metrics import RouterMetrics
from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED
from service.settings import Settings
from service.startup.download_port import download_status
from service.startup.model_sources import choose_model, downloads
from service.startup.table_report import TableReport, listed_name_of, plan_table

log = logging.getLogger("service")


def run_table(settings: Settings, listen: Callable[[], socket.socket]) -> int:
    """`listen`: binds the service's address (StartRefused when it cannot). A hub model not in the cache is downloaded
    before the plan, while the port answers the probes with the download's progress, as for one model."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per relayed request: the engines log each already
    if any(downloads(choose_model(settings.for_listed(e), build_demo=False)) for e in settings.models):
        with download_status(listen()) as progress:
            table = plan_table(settings, download=True, progress=progress)
    else:
        table = plan_table(settings)
    sock = listen()
    for error in table.errors:
        log.error("refusing to start: %s", error)
    if not table.ok:
        return EXIT_STARTUP_REFUSED
    return uvloop.run(_serve(settings, table, sock))


def engines_of(settings: Settings, table: TableReport) -> dict[str, Engine]:
    engines = {}
    for listed in table.models:
        name = listed_name_of(listed)
        kv = listed.report.plan.engine_args.get("kv_cache_memory_bytes")
        config = child_settings(settings.for_listed(listed.entry), name, kv if isinstance(kv, int) else None, 0)
        engines[name] = Engine(name, tuple(listed.entry.aliases), listed.entry.pinned, listed.entry.idle_unload, config)
    return engines


def _uvicorn_config(settings: Settings, app: FastAPI) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_seconds)),
        timeout_keep_alive=75,  # as one model's service (server/run.py)
        lifespan="off",
    )


async def _load_pinned(engines: Engines) -> bool:
    """Loads the pinned models before the table is ready; False (said) when one cannot be served."""
    for name, engine in engines.engines.items():
        if engine.pinned:
            try:
                await engines.load(name, float("inf"))
            except NotServed as exc:
                log.error("refusing to start: pinned %s", exc)
                return False
    return True


async def _serve(settings: Settings, table: TableReport, sock: socket.socket) -> int:
    metrics = RouterMetrics()
    # The engines' key: theirs and the front end's alone; a new one each start.
    engines = Engines(
        engines_of(settings, table),
        table.engines,
        settings.cache_dir / "model-table",
        secrets.token_urlsafe(32),
        settings.shutdown_grace_seconds,
        metrics,
        table.cpus.slots,
    )
    started = asyncio.Event()
    app = create_router_app(settings, table, engines, metrics, started)
    server = uvicorn.Server(_uvicorn_config(settings, app))
    exit_code = 0

    async def bring_up() -> None:
        nonlocal exit_code
        if not await _load_pinned(engines):
            exit_code, server.should_exit = EXIT_STARTUP_REFUSED, True
            return
        started.set()
        log.info(
            "ready: serving %s on http://%s:%d (%d engine(s) at once; unpinned models load on their first request)",
            ", ".join(engines.engines),
            settings.host,
            settings.port,
            table.engines,
        )

    tasks = [asyncio.create_task(bring_up()), asyncio.create_task(engines.watch_idle())]
    host, port = sock.getsockname()[:2]
    log.info("listening on http://%s:%d: the model table's front end", f"[{host}]" if ":" in host else host, port)
    await server.serve(sockets=[sock])
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await engines.stop_all()
    await app.state.client.aclose()
    return exit_code
