"""Readiness, draining and engine liveness: the one piece of mutable state the HTTP layer consults."""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import Any

from service.facts.oom_kills import OomKills, live_oom_kills
from service.server.supervision.engine_death import OomSince, death_cause, oom_since

EXIT_STARTUP_REFUSED = 2  # the start refused: a setting, the model or the machine; restarting will not help
EXIT_ENGINE_DIED = 3  # the engine died or hung: a restart may


class Phase(enum.Enum):
    STARTING = "starting"  # engine loading
    WARMING_UP = "warming up"  # engine up, warm-up request running; /ready still 503
    READY = "ready"
    DRAINING = "draining"  # SIGTERM received: finishing in-flight requests
    DEAD = "dead"  # engine died, or failed to start


@dataclass
class Lifecycle:
    started_at: float = field(default_factory=time.monotonic)
    phase: Phase = Phase.STARTING
    reason: str = "engine is loading the model"
    engine: Any = None  # vLLM EngineClient once started
    engine_processes: list[Any] = field(default_factory=list)  # psutil.Process of the engine core and workers
    in_flight: int = 0
    exit_code: int = 0
    cut_reason: str | None = None  # set when the shutdown ends the requests still in flight: why
    oom_kills_at_start: OomKills | None = None  # the kernel's OOM-kill count when the engine started
    gguf_check: dict[str, Any] | None = None  # a GGUF file's check against llama.cpp, once run (gguf_check_run.py)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    def set_phase(self, phase: Phase, reason: str) -> None:
        # A dead engine stays dead: draining must not hide it from /health.
        if self.phase is Phase.DEAD:
            return
        self.phase, self.reason = phase, reason

    @property
    def engine_errored(self) -> bool:
        """vLLM's engine has died (its core, or a worker under it): it answers nothing any more."""
        return bool(getattr(self.engine, "errored", False))

    def engine_died(self) -> str:
        """Marks the service dead because its engine died, saying how (once: the first cause seen stays); the
        reason, which every answer from now on gives."""
        if self.phase is not Phase.DEAD:
            cause = death_cause(self.engine, self.engine_processes, self.oom_kills_since_start())
            self.set_phase(Phase.DEAD, f"engine died: {cause}")
        return self.reason

    def remember_engine_processes(self, processes: list[Any]) -> None:
        """Adds the engine processes not seen before: one that ends during the start is then named in its cause."""
        seen = {proc.pid for proc in self.engine_processes}
        self.engine_processes += [proc for proc in processes if proc.pid not in seen]

    def engine_starting(self) -> None:
        self.oom_kills_at_start = _oom_kills()

    def oom_kills_since_start(self) -> OomSince | None:
        return oom_since(self.oom_kills_at_start, _oom_kills())

    @property
    def accepting(self) -> bool:
        """Engine requests are admitted (the warm-up request is one)."""
        return self.phase in (Phase.WARMING_UP, Phase.READY)

    def request_started(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def request_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False


def _oom_kills() -> OomKills | None:
    try:
        return live_oom_kills()
    except (OSError, ValueError):  # a count that cannot be read says nothing
        return None
