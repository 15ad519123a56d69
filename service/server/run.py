"""`python -m service serve`: startup hook first (before any vLLM process exists), then HTTP + engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import uvicorn
import uvloop
from rich.console import Console

from service.cache.permissions import cache_dir_problem
from service.facts.api_key import api_key_of
from service.facts.software import KERNEL_SOURCE
from service.kernels.build_at_start import build_at_start
from service.policy.access import plan_access
from service.server.download_status import download_status
from service.server.engine_death import alive, death_cause, oom_note
from service.server.engine_probe import HangProbe
from service.server.lifecycle import Lifecycle, Phase
from service.server.start_watch import StartWatch, process_usage
from service.settings import Settings
from service.startup import (
    apply,
    build_report,
    calibrated_report,
    choose_model,
    downloads,
    fetch_model,
    prepare_model,
)
from service.startup.report import StartupReport
from service.startup.self_preload import mapped_files, missing_from, reexec_argv, reexec_environ, restore_user_preload

log = logging.getLogger("service")
EXIT_STARTUP_REFUSED = 2
EXIT_ENGINE_DIED = 3
WATCHDOG_INTERVAL_S = 1.0
DEAD_LINGER_S = 3.0  # keep answering /health 503 briefly so probes see why before the process exits
CUT_WAIT_S = 5.0  # for the engine to abort the requests still in flight at shutdown, and for them to answer
START_STOP_WAIT_S = 30.0  # for an engine start that a stop ended to fail, before its processes are killed


class DrainingServer(uvicorn.Server):
    """First SIGTERM/SIGINT/SIGHUP: /ready turns 503, new requests get 503, in-flight ones finish (up to the grace
    period), then exit 0. A second signal ends the grace period at once; a third exits without waiting at all.
    Requests the grace period does not cover are ended: aborted in the engine, each answered 503 or, once its
    stream has started, with an error event (engine_responses.py)."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, grace_s: float) -> None:
        super().__init__(config)
        self.lifecycle, self.grace_s = lifecycle, grace_s
        self._drain: asyncio.Task | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGINT/SIGTERM, and SIGHUP (the terminal of `make serve` closed): by default it killed the
        process at once, ending every stream without its last event. Under `nohup` (SIGHUP ignored) it stays
        ignored."""
        with super().capture_signals():
            if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
                yield
                return
            hangup = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, hangup)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown and turn exit 0 into 143.
        name = signal.Signals(sig).name
        if self.should_exit or self.lifecycle.cut_reason is not None:
            log.warning("received %s again: exiting now", name)
            self.should_exit = self.force_exit = True
            return
        loop = asyncio.get_event_loop()
        if self._drain is not None:
            self._drain.cancel()
            self._drain = loop.create_task(self._cut_then_exit(f"{name} received twice"))
            return
        log.warning(
            "received %s: draining (%d request(s) in flight, grace %.0fs)", name, self.lifecycle.in_flight, self.grace_s
        )
        self.lifecycle.set_phase(Phase.DRAINING, f"received {name}: finishing in-flight requests")
        self._drain = loop.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        if await self.lifecycle.wait_idle(self.grace_s):
            self.should_exit = True
        else:
            await self._cut_then_exit(f"shutdown grace period of {self.grace_s:g}s over")

    async def _cut_then_exit(self, reason: str) -> None:
        log.warning("%s: ending the %d request(s) still in flight", reason, self.lifecycle.in_flight)
        self.lifecycle.cut_reason = reason
        engine = self.lifecycle.engine
        if engine is not None and not getattr(engine, "errored", False):
            try:  # vLLM's own way to end every request (its weight-update pause): each gets its final output
                await asyncio.wait_for(engine.pause_generation(mode="abort", clear_cache=False), CUT_WAIT_S)
            except Exception as exc:  # uvicorn cancels what is left
                log.warning("aborting the engine's requests failed: %r", exc)
        if not await self.lifecycle.wait_idle(CUT_WAIT_S):
            log.warning("%d request(s) did not end: cancelled", self.lifecycle.in_flight)
        self.should_exit = True


def _log_report(report: StartupReport) -> None:
    console = Console(stderr=True, width=160)
    report.render(console)
    log.info("startup report %s", json.dumps(report.to_dict()))


def _preload_self(decided: str | None, user_preload: str | None, reexecuted: bool) -> None:
    """Execute this process again with the engine's preload, unless it is loaded here already
    (service/startup/self_preload.py)."""
    missing = missing_from(decided, mapped_files(Path("/proc/self/maps").read_text()))
    if not missing:
        return
    if reexecuted:
        log.warning("the service's own process did not load %s; its engine processes get them", ", ".join(missing))
        return
    log.info("executing the service again with LD_PRELOAD=%s: its own process allocates with it too", decided)
    sys.stdout.flush()
    sys.stderr.flush()
    env = reexec_environ({**os.environ, "LD_PRELOAD": decided or ""}, user_preload)
    os.execve(sys.executable, reexec_argv(sys.executable, sys.argv), env)


def run(settings: Settings) -> int:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The service's logger carries its own level: the root logger ends up at ERROR once the engine has started
    # (a library raises it), which silenced "ready", "received SIGTERM: draining" and friends.
    logging.getLogger("service").setLevel(settings.log_level.upper())
    reexecuted = restore_user_preload(os.environ)
    user_preload = os.environ.get("LD_PRELOAD")
    started = time.monotonic()
    if (problem := cache_dir_problem(settings.cache_dir)) is not None:
        log.error("refusing to start: %s", problem)
        return EXIT_STARTUP_REFUSED
    access = plan_access(settings.host, api_key_of(settings), settings.allow_unauthenticated, settings.allowed_hosts)
    if access.errors:  # before anything is read or built: a deployment that forgot its key stays closed
        log.error("refusing to start: %s", "; ".join(access.errors))
        return EXIT_STARTUP_REFUSED
    # Before the facts are read: they find the build this makes (an image's first start on a CPU).
    build_at_start(settings.build_kernels, KERNEL_SOURCE)  # logs what it did
    choice = choose_model(settings, build_demo=True)
    if downloads(choice):  # a first start may download for minutes: the port says so meanwhile
        try:
            early = _bind(settings.host, settings.port)
        except OSError as exc:
            log.error(
                "refusing to start: cannot listen on %s:%d: %s", settings.host, settings.port, exc.strerror or exc
            )
            return EXIT_STARTUP_REFUSED
        with download_status(early, f"fetching {choice.location}") as progress:
            choice = fetch_model(choice, settings, download=True, progress=progress)
    try:
        report = build_report(settings, model=choice)
    except (OSError, ValueError) as exc:  # a cgroup or sysfs file that does not parse: `detect` says the same
        log.error("refusing to start: cannot read the hardware facts: %s", exc)
        return EXIT_STARTUP_REFUSED
    if report.ok:
        # Calibrated before the re-execution: a verdict can change the backend, and with it the preload. The
        # re-executed process reads the stored timings (even under force: the first process has just timed).
        mode = "auto" if reexecuted and settings.calibrate == "force" else settings.calibrate
        try:
            report = calibrated_report(report, settings, choice, mode)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log.warning("calibration failed, the built-in table decides: %s", exc)
        if report.ok:
            _preload_self(report.plan.env.get("LD_PRELOAD"), user_preload, reexecuted)
    if choice.demo:
        log.warning(
            "DEMO MODEL: serving the built-in tiny random-weight model %r from %s. It answers gibberish; leave "
            "SERVICE_MODEL unset for the default model (SmolLM2-135M-Instruct) or set it to a real one.",
            choice.name,
            choice.location,
        )
    _log_report(report)
    if not report.ok:
        log.error("refusing to start: %s", "; ".join(report.errors))
        return EXIT_STARTUP_REFUSED
    try:
        sock = _bind(settings.host, settings.port)
    except OSError as exc:
        log.error("refusing to start: cannot listen on %s:%d: %s", settings.host, settings.port, exc.strerror or exc)
        return EXIT_STARTUP_REFUSED
    apply(report)
    try:
        model = prepare_model(report)
    except Exception as exc:  # a conversion that failed leaves nothing in the cache (service/models/gguf_convert.py)
        log.error("refusing to start: %s", exc)
        return EXIT_STARTUP_REFUSED
    served = report.plan.model.served_name
    # uvloop, as vLLM's own server uses: the stdlib loop's socket writes cost ~20% more API CPU per request
    # (measured by `make bench`, see README).
    return uvloop.run(_serve(settings, report, model, served, choice.demo, started, sock))


def _bind(host: str, port: int) -> socket.socket:
    """The server's address, taken before the engine loads: a port in use refuses the start at once (uvicorn
    binds only when it starts serving; the engine, started beside it, then loaded for a minute and the process
    exited 3, as if the engine had died). Not listening yet: until uvicorn serves, connections are refused, not
    left waiting in the backlog."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart may find TIME_WAIT sockets
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def _serve(
    settings: Settings, report: StartupReport, model: str, served: str, demo: bool, started: float, sock: socket.socket
) -> int:
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    from service.server import client_error_logs
    from service.server.admission import connection_limit
    from service.server.app import create_app
    from service.server.engine import (
        EngineConfigRefused,
        EngineDied,
        cache_vllm_environment,
        serving_lifespan,
        start_engine,
        unless_dead,
        vllm_args,
        warm_up,
    )
    from service.server.metrics import ServiceMetrics

    lifecycle = Lifecycle(started_at=started)
    metrics = ServiceMetrics(get_prometheus_registry())
    metrics.describe_startup(report, served)
    args = vllm_args(report.plan.engine_args, model, served, settings.max_queued_requests)
    shell = create_app(settings, report, lifecycle, metrics, args, served_model=served, demo=demo)
    config = uvicorn.Config(
        shell.app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_seconds)),
        # Longer than clients' and load balancers' idle timeouts (httpx 5 s, cloud load balancers 60 s): the client
        # then drops an idle connection first, instead of reusing one the server is closing (a reset request).
        timeout_keep_alive=75,
        limit_concurrency=connection_limit(settings.max_queued_requests),
        lifespan="off",
    )
    server = DrainingServer(config, lifecycle, settings.shutdown_grace_seconds)
    key = api_key_of(settings).value
    embedding = report.model is not None and report.model.is_embedding

    async def bring_up(stack: contextlib.AsyncExitStack) -> None:
        lifecycle.engine_starting()
        try:
            lifecycle.engine, vllm_app = await start_engine(args, shell.app.state, stack)
            lifecycle.engine_processes = _engine_processes()
            shell.attach_engine(vllm_app)
            client_error_logs.install()  # vLLM's serving modules are imported by now
            await asyncio.to_thread(shell.app.openapi)
            lifecycle.set_phase(Phase.WARMING_UP, "engine up, warm-up request running")
            if settings.warmup:
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                await unless_dead(lifecycle.engine, warm_up(shell.app, served, embedding, headers))
            frozen = await stack.enter_async_context(serving_lifespan(shell.app))
            cache_vllm_environment()
            log.info("froze %d start-up objects out of the garbage collector (as vLLM's own server does)", frozen)
        except Exception as exc:
            if lifecycle.phase is Phase.DRAINING:  # stopped while starting: _end_engine_start stopped its processes
                log.warning("engine start ended by the stop: %s", exc)
                return
            if lifecycle.phase is Phase.DEAD:  # a hung start: _watch_start killed its processes and said why
                log.warning("engine start ended: %s", exc)
                return
            refused = isinstance(exc, EngineConfigRefused)
            if refused:
                reason = f"refusing to start: {exc}"
                log.error("%s", reason)
            elif isinstance(exc, EngineDied):  # its processes say how; vLLM's traceback is in the log above
                cause = death_cause(exc.engine, lifecycle.engine_processes, lifecycle.oom_kills_since_start())
                reason = f"engine failed to start: {exc}: {cause}"
                log.error("%s", reason)
            elif gone := [proc for proc in lifecycle.engine_processes if not alive(proc)]:
                # vLLM's start failed on a call the dead process could not answer ("Call to get_supported_tasks
                # method failed: cancelled"): the process that ended is the cause.
                cause = death_cause(None, gone, lifecycle.oom_kills_since_start())
                reason = f"engine failed to start: {exc}: {cause}"
                log.error("%s", reason)
            else:
                oom = oom_note(lifecycle.oom_kills_since_start())  # a process killed by SIGKILL logs nothing
                reason = f"engine failed to start: {exc}" + (f" ({oom})" if oom else "")
                log.exception("%s", reason)
            lifecycle.set_phase(Phase.DEAD, reason)
            lifecycle.exit_code = EXIT_STARTUP_REFUSED if refused else EXIT_ENGINE_DIED
            server.should_exit = True
            return
        if lifecycle.phase is Phase.WARMING_UP:
            lifecycle.set_phase(Phase.READY, "model loaded and warmed up")
            metrics.ready.set(1)
            metrics.startup_seconds.set(time.monotonic() - started)
            log.info("ready: serving %r on http://%s:%d", served, settings.host, settings.port)
        await _watchdog(lifecycle, server, settings.engine_stall_seconds)

    async with contextlib.AsyncExitStack() as stack:
        engine_task = asyncio.create_task(bring_up(stack))
        start_watch = asyncio.create_task(_watch_start(lifecycle, server, settings.engine_stall_seconds))
        # uvicorn logs its address only for the sockets it binds itself
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        log.info("listening on http://%s:%d: /health and /ready answer while the engine loads", shown, port)
        await server.serve(sockets=[sock])
        metrics.ready.set(0)
        _note_a_death_while_stopping(lifecycle)
        if lifecycle.engine is None and not engine_task.done():
            await _end_engine_start(engine_task)
        for task in (engine_task, start_watch):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    _stop_leftover_engine_processes(lifecycle.engine_processes)
    return lifecycle.exit_code


async def _watchdog(lifecycle: Lifecycle, server: uvicorn.Server, stall_s: float) -> None:
    """The engine core is a separate process: when it dies or hangs, /health turns 503 and the process exits
    non-zero so the container's restart policy brings the service back."""
    engine = lifecycle.engine
    probe = HangProbe(engine.is_sleeping, stall_s) if stall_s > 0 else None
    hung = None
    while not server.should_exit:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        if lifecycle.phase is Phase.DEAD:
            break
        if lifecycle.engine_errored:
            lifecycle.engine_died()
            break
        if probe is not None and (hung := probe.look()) is not None:
            lifecycle.set_phase(Phase.DEAD, hung)
            break
    if probe is not None:
        probe.close()
    if lifecycle.phase is Phase.DEAD:
        log.error("engine is dead (%s): exiting", lifecycle.reason)
        if hung is not None:
            await _end_what_a_hung_engine_holds(lifecycle, hung)
        await asyncio.sleep(DEAD_LINGER_S)
        lifecycle.exit_code = EXIT_ENGINE_DIED
        server.should_exit = True
        if hung is not None:  # its requests can never finish: waiting the grace period would only delay the restart
            server.force_exit = True


async def _watch_start(lifecycle: Lifecycle, server: uvicorn.Server, stall_s: float) -> None:
    """While the engine starts and warms up (the watchdog's probe takes over once it serves): a start that makes no
    progress for `stall_s` is hung. Its processes are killed (a stopped one acts on no other signal), which ends
    vLLM's wait for them, and the service exits 3 to be restarted, as for a hang of a running engine. The engine's
    processes are remembered as they appear: an engine that dies during the start is then told by the one that ended
    (vLLM's start returns none of them)."""
    watch = StartWatch(process_usage, stall_s) if stall_s > 0 else None
    while lifecycle.phase in (Phase.STARTING, Phase.WARMING_UP) and not server.should_exit:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        lifecycle.remember_engine_processes(_engine_processes())
        if watch is None or (hung := watch.look()) is None:
            continue
        lifecycle.set_phase(Phase.DEAD, hung)
        log.error("engine is dead (%s): exiting", hung)
        _kill_descendants()
        await asyncio.sleep(DEAD_LINGER_S)
        lifecycle.exit_code = EXIT_ENGINE_DIED
        server.should_exit = server.force_exit = True
        return


def _kill_descendants() -> None:
    import psutil

    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            proc.kill()


async def _end_what_a_hung_engine_holds(lifecycle: Lifecycle, reason: str) -> None:
    """Each request in flight gets its answer, a 503 or an error event, instead of a cut connection: vLLM's abort
    gives each its final output in this process, whatever the engine core does with the abort it is sent."""
    lifecycle.cut_reason = reason
    engine = lifecycle.engine
    try:
        await asyncio.wait_for(engine.abort(list(engine.output_processor.request_states), internal=True), CUT_WAIT_S)
    except Exception as exc:
        log.warning("aborting the hung engine's requests failed: %r", exc)
    if not await lifecycle.wait_idle(CUT_WAIT_S):
        log.warning("%d request(s) did not end: cancelled", lifecycle.in_flight)


def _note_a_death_while_stopping(lifecycle: Lifecycle) -> None:
    """An engine that died during the drain failed the requests in flight (each answered 500): that stop is no
    clean one. The drain ended as soon as they were answered, before the watchdog's next look, and the exit was 0."""
    if lifecycle.exit_code == 0 and getattr(lifecycle.engine, "errored", False):
        log.error("engine is dead (it died while the service stopped): exiting %d", EXIT_ENGINE_DIED)
        lifecycle.exit_code = EXIT_ENGINE_DIED


async def _end_engine_start(task: asyncio.Task) -> None:
    """A stop while the engine starts. AsyncLLM's constructor blocks its thread until the engine is up (minutes for
    a large model: the process waited for it at exit, past a container's stop timeout), so the engine's processes
    are stopped, which fails that wait at once. Every round stops what was spawned since the last."""
    import psutil

    log.warning("stopping the engine start")
    deadline = time.monotonic() + START_STOP_WAIT_S
    while not task.done() and time.monotonic() < deadline:
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        await asyncio.wait({task}, timeout=0.5)
    if not task.done():
        log.warning("the engine start did not end within %.0fs: killing its processes", START_STOP_WAIT_S)
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _engine_processes() -> list:
    """vLLM's engine core and worker processes, remembered while they are still our descendants: once the
    core is killed, its worker is re-parented and no longer found below this process."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if _is_vllm_process(p)]


def _stop_leftover_engine_processes(known: list, wait_s: float = 3.0) -> None:
    """When the engine core is killed, its worker can outlive it (orphaned, still holding memory and cores)
    while a restarted service starts next to it. Stop any vLLM process of ours still there on the way out."""
    import psutil

    left = [p for p in {*known, *_engine_processes()} if alive(p)]
    if not left:
        return
    log.warning("stopping %d leftover engine process(es): %s", len(left), ", ".join(str(p.pid) for p in left))
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, still_running = psutil.wait_procs(left, timeout=wait_s)
    for proc in still_running:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _is_vllm_process(proc) -> bool:
    """vLLM's engine core and workers: named "VLLM::..." once they run, and before that (their seconds of imports,
    in which a worker can die too) the children multiprocessing spawned."""
    try:
        return proc.name().startswith("VLLM::") or "multiprocessing.spawn" in " ".join(proc.cmdline())
    except Exception:  # psutil.Error: gone already
        return False
