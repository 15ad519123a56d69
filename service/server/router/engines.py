"""The engines of the model table while the service runs: each a `python -m service serve` child on a loopback port,
started by the first request that names its model, stopped when another load needs its room (eviction.py), when idle
for its `idle_unload`, or by the admin routes. A child that exits (its engine died, it refused to start) takes only
its own model down; the next request for that model starts it again."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import functools
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from service.facts.cpulist import format_cpulist
from service.server.router.child_config import child_env, write_config
from service.server.router.eviction import Running, room_for_load
from service.server.router.router_metrics import RouterMetrics
from service.server.supervision.lifecycle import EXIT_ENGINE_DIED, EXIT_STARTUP_REFUSED

log = logging.getLogger("service.models")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_EXITS = {0: "stopped", EXIT_STARTUP_REFUSED: "refused to start", EXIT_ENGINE_DIED: "its engine died"}


class State(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    STOPPING = "stopping"


@dataclass
class Engine:
    name: str
    aliases: tuple[str, ...]
    pinned: bool
    idle_unload: float | None
    config: dict  # the child's settings but its port (child_config.child_settings)
    state: State = State.UNLOADED
    reason: str = "not loaded yet"
    process: asyncio.subprocess.Process | None = None
    url: str | None = None
    in_flight: int = 0
    last_used: float = 0.0
    loads: int = 0  # load attempts so far
    failed: bool = False  # the last attempt ended before the engine was ready
    load_seconds: float | None = None
    stop_reason: str | None = None
    cpus: tuple[int, ...] | None = None  # its slot of a split table while it runs; None: every allowed CPU
    _tasks: set[asyncio.Task] = field(default_factory=set)


class NotServed(Exception):
    """A request for a model that is not loaded in time, or whose load failed: 503, with Retry-After unless failed."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class Engines:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        capacity: int,
        directory: Path,
        key: str,
        grace_s: float,
        metrics: RouterMetrics,
        slots: tuple[tuple[int, ...], ...] = (),
    ) -> None:
        """`slots`: with the table's CPUs split, the CPUs of each of the `capacity` engines at once."""
        self.engines = dict(engines)
        self.capacity = capacity
        self._slots = slots
        self._directory, self._key, self._grace_s, self._metrics = directory, key, grace_s, metrics
        self._changed = asyncio.Condition()
        self._client = httpx.AsyncClient(timeout=5, headers={"Authorization": f"Bearer {key}"})
        for engine in self.engines.values():
            metrics.state(engine.name, engine.state.value)

    @property
    def key(self) -> str:
        return self._key

    async def acquire(self, name: str, wait_s: float) -> Engine:
        """The loaded engine of `name`, with this request counted in flight (release it); loads it, making room
        first, when it is not loaded. NotServed when it is not ready within `wait_s`, or its load failed."""
        engine = self.engines[name]
        deadline = time.monotonic() + wait_s
        attempts = engine.loads - (engine.state is State.LOADING)  # a load under way is this request's too
        why = "loading"
        async with self._changed:
            while True:
                if engine.state is State.LOADED:
                    engine.in_flight += 1
                    self._metrics.in_flight(name, engine.in_flight)
                    return engine
                if engine.state is State.UNLOADED:
                    if engine.loads > attempts and engine.failed:
                        raise NotServed(f"the model {name!r} failed to load: {engine.reason}", retry=False)
                    why = self._make_room(engine)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NotServed(f"the model {name!r} is not loaded yet ({why})", retry=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)

    async def release(self, engine: Engine) -> None:
        async with self._changed:
            engine.in_flight -= 1
            engine.last_used = time.monotonic()
            self._metrics.in_flight(engine.name, engine.in_flight)
            self._changed.notify_all()

    async def load(self, name: str, wait_s: float) -> Engine:
        """The admin route's load: as a request's, without counting one in flight."""
        engine = await self.acquire(name, wait_s)
        await self.release(engine)
        return engine

    async def unload(self, name: str, reason: str = "unloaded by the admin route") -> str | None:
        """Stops the engine of `name`; the reason it may not, else None once it has stopped."""
        engine = self.engines[name]
        async with self._changed:
            if engine.in_flight:
                return f"{engine.in_flight} request(s) in flight on {name!r}: it is not stopped under them"
            if engine.state in (State.LOADING, State.LOADED):
                self._stop(engine, "admin", reason)
            while engine.state is not State.UNLOADED:
                await self._changed.wait()
        return None

    async def watch_idle(self, interval_s: float = 1.0) -> None:
        """Stops engines idle for their `idle_unload`."""
        while True:
            await asyncio.sleep(interval_s)
            async with self._changed:
                now = time.monotonic()
                for engine in self.engines.values():
                    idle = now - engine.last_used
                    if (
                        engine.idle_unload
                        and engine.state is State.LOADED
                        and not engine.in_flight
                        and idle >= engine.idle_unload
                    ):
                        self._stop(engine, "idle", f"idle for {idle:.0f} s (idle_unload {engine.idle_unload:g} s)")

    async def stop_all(self) -> None:
        async with self._changed:
            for engine in self.engines.values():
                if engine.state in (State.LOADING, State.LOADED):
                    self._stop(engine, "shutdown", "the service is stopping")
            while any(e.state is not State.UNLOADED for e in self.engines.values()):
                await self._changed.wait()
        await self._client.aclose()

    def _running(self) -> list[Running]:
        return [
            Running(e.name, e.state.value, e.pinned, e.in_flight, e.last_used)
            for e in self.engines.values()
            if e.state is not State.UNLOADED
        ]

    def _make_room(self, engine: Engine) -> str:
        """Starts the load of `engine` if there is room, else the stop that makes it; what the load waits for."""
        room = room_for_load(self._running(), self.capacity)
        if room.load:
            self._start(engine)
            return "loading"
        if room.stop is not None:
            self._stop(self.engines[room.stop], "evicted", f"{room.why}, to load {engine.name!r}")
            return f"stopping {room.stop!r} to make room"
        return room.why

    def _start(self, engine: Engine) -> None:
        engine.state, engine.reason, engine.failed, engine.stop_reason = State.LOADING, "loading", False, None
        engine.loads += 1
        if self._slots:
            held = {e.cpus for e in self.engines.values() if e.state is not State.UNLOADED and e is not engine}
            engine.cpus = next(slot for slot in self._slots if slot not in held)  # room_for_load left one free
        self._metrics.state(engine.name, engine.state.value)
        self._spawn(engine, self._run(engine))

    def _stop(self, engine: Engine, kind: str, reason: str) -> None:
        log.info("stopping the engine of %r: %s", engine.name, reason)
        engine.state, engine.stop_reason = State.STOPPING, reason
        self._metrics.state(engine.name, engine.state.value)
        self._metrics.unloaded(engine.name, kind)
        self._spawn(engine, self._terminate(engine))

    def _spawn(self, engine: Engine, work) -> None:
        task = asyncio.create_task(work)
        engine._tasks.add(task)
        task.add_done_callback(engine._tasks.discard)

    async def _run(self, engine: Engine) -> None:
        """Starts the child, marks it loaded once its /ready answers 200, and unloaded when it exits."""
        started = time.monotonic()
        port = _free_port()
        config = write_config(self._directory, engine.name, engine.config | {"port": port})
        where = f"CPUs {format_cpulist(engine.cpus)}" if engine.cpus else "every allowed CPU"
        log.info("loading %r on 127.0.0.1:%d, %s (load %d)", engine.name, port, where, engine.loads)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service",
            "serve",
            env=child_env(os.environ, config, self._key),
            start_new_session=True,  # its own group: a stop that outlasts the grace kills its engine with it
            preexec_fn=functools.partial(_prepare_child, engine.cpus),
        )
        engine.process, engine.url = process, f"http://127.0.0.1:{port}"
        ready = asyncio.create_task(self._until_ready(engine.url))
        exited = asyncio.create_task(process.wait())
        await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
        async with self._changed:
            if ready.done() and not exited.done() and engine.state is State.LOADING:
                engine.load_seconds = time.monotonic() - started
                engine.state, engine.reason = State.LOADED, f"loaded in {engine.load_seconds:.1f} s"
                engine.last_used = time.monotonic()
                log.info("%r ready: loaded in %.1f s", engine.name, engine.load_seconds)
                self._metrics.loaded(engine.name, engine.load_seconds)
                self._metrics.state(engine.name, engine.state.value)
                self._changed.notify_all()
        ready.cancel()
        code = await exited
        async with self._changed:
            was = engine.state
            what = _EXITS.get(code, f"exited with {code}")
            engine.reason = f"{what}: {engine.stop_reason}" if engine.stop_reason else what
            engine.failed = was is State.LOADING
            if was is not State.STOPPING:
                log.error(
                    "the engine of %r ended: %s (exit %d); the next request loads it again",
                    engine.name,
                    engine.reason,
                    code,
                )
                self._metrics.unloaded(engine.name, "failed" if engine.failed else "died")
            engine.state, engine.process, engine.url, engine.cpus = State.UNLOADED, None, None, None
            self._metrics.state(engine.name, engine.state.value)
            self._changed.notify_all()

    async def _until_ready(self, url: str) -> None:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await self._client.get(f"{url}/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.5)

    async def _terminate(self, engine: Engine) -> None:
        """SIGTERM (the child drains its requests, then stops its engine); its whole group killed past the grace."""
        process = engine.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self._grace_s + 15)
        except TimeoutError:
            log.warning("the engine of %r outlived its stop: killing its process group", engine.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def _prepare_child(cpus: tuple[int, ...] | None) -> None:
    """In the child before exec: SIGTERM when the front end dies, so that a killed front end (SIGKILL, the OOM
    killer) leaves no engine running without a port anyone reaches; and its slot's CPUs, which its own facts then
    read as its allowed CPUs (sched_getaffinity), so its plan binds inside them."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if cpus:
        os.sched_setaffinity(0, cpus)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
