"""Whether the engine still lives: while it starts (a start that makes no progress is hung) and while it serves
(dead or hung). Either way /health turns 503 and the process exits non-zero, so the container's restart policy
brings the service back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import uvicorn

from service.server.supervision.draining_server import CUT_WAIT_S
from service.server.supervision.engine_death import alive, describe
from service.server.supervision.engine_probe import HangProbe
from service.server.supervision.engine_processes import engine_processes, is_named_worker
from service.server.supervision.lifecycle import EXIT_ENGINE_DIED, Lifecycle, Phase
from service.server.supervision.start_watch import StartWatch, process_usage

log = logging.getLogger("service")
WATCHDOG_INTERVAL_S = 1.0
DEAD_LINGER_S = 3.0  # keep answering /health 503 briefly so probes see why before the process exits


async def watch_engine(lifecycle: Lifecycle, server: uvicorn.Server, stall_s: float) -> None:
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


async def watch_start(lifecycle: Lifecycle, server: uvicorn.Server, stall_s: float) -> None:
    """While the engine starts and warms up (the watchdog's probe takes over once it serves): a start that makes no
    progress for `stall_s` is hung. Its processes are killed (a stopped one acts on no other signal), which ends
    vLLM's wait for them, and the service exits 3 to be restarted, as for a hang of a running engine. The engine's
    processes are remembered as they appear: an engine that dies during the start is then told by the one that ended
    (vLLM's start returns none of them), and a worker vLLM named that ended ends the start at once, exit 3."""
    watch = StartWatch(process_usage, stall_s) if stall_s > 0 else None
    workers: dict[int, Any] = {}
    while lifecycle.phase in (Phase.STARTING, Phase.WARMING_UP) and not server.should_exit:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        processes = engine_processes()
        lifecycle.remember_engine_processes(processes)
        workers |= {proc.pid: proc for proc in processes if is_named_worker(proc)}
        if lifecycle.phase not in (Phase.STARTING, Phase.WARMING_UP):  # a stop began while this one slept
            return
        # vLLM's engine core notices a dead worker only when its monitor thread runs, late on a loaded CPU
        # (docs/reliability.md), while the service's call to it waits. A worker gone from the process table is enough.
        if ended := [pid for pid, proc in workers.items() if not alive(proc)]:
            why = f"engine failed to start: {describe({}, ended, lifecycle.oom_kills_since_start())}"
            lifecycle.set_phase(Phase.DEAD, why)
            log.error("%s", why)
        elif watch is None or (hung := watch.look()) is None:
            continue
        else:
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


def note_a_death_while_stopping(lifecycle: Lifecycle) -> None:
    """An engine that died during the drain failed the requests in flight (each answered 500): that stop is no
    clean one. The drain ended as soon as they were answered, before the watchdog's next look, and the exit was 0."""
    if lifecycle.exit_code == 0 and getattr(lifecycle.engine, "errored", False):
        log.error("engine is dead (it died while the service stopped): exiting %d", EXIT_ENGINE_DIED)
        lifecycle.exit_code = EXIT_ENGINE_DIED
