"""vLLM's engine core and worker processes below this one: found, stopped at the end of a start a stop ended, and
stopped when they outlive the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from service.server.supervision.engine_death import alive

log = logging.getLogger("service")
START_STOP_WAIT_S = 30.0  # for an engine start that a stop ended to fail, before its processes are killed


async def end_engine_start(task: asyncio.Task) -> None:
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


def engine_processes() -> list:
    """vLLM's engine core and worker processes, remembered while they are still our descendants: once the
    core is killed, its worker is re-parented and no longer found below this process."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if is_vllm_process(p)]


def stop_leftover_engine_processes(known: list, wait_s: float = 3.0) -> None:
    """When the engine core is killed, its worker can outlive it (orphaned, still holding memory and cores)
    while a restarted service starts next to it. Stop any vLLM process of ours still there on the way out."""
    import psutil

    left = [p for p in {*known, *engine_processes()} if alive(p)]
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


def is_named_worker(proc) -> bool:
    """A worker vLLM has named (VLLM::Worker...; not an engine core, VLLM::EngineCore...): a process that is surely
    one of the engine's, unlike a spawned child still importing, whose end the start watch can count as a death."""
    try:
        name = proc.name()
    except Exception:  # psutil.Error: gone already
        return False
    return name.startswith("VLLM::") and "EngineCore" not in name


def is_vllm_process(proc) -> bool:
    """vLLM's engine core and workers: named "VLLM::..." once they run (a forked worker from its start, with its engine
    core's name until vLLM renames it), and before that the children multiprocessing started: a spawned one (its
    seconds of imports, in which a worker can die too) by its command line, a forked engine core (service/in_vllm/
    worker_start.py) by this process's command line, which it holds until vLLM names it."""
    import psutil

    try:
        cmdline = proc.cmdline()
        return (
            proc.name().startswith("VLLM::")
            or "multiprocessing.spawn" in " ".join(cmdline)
            or (proc.ppid() == os.getpid() and cmdline == psutil.Process().cmdline())
        )
    except Exception:  # psutil.Error: gone already
        return False
