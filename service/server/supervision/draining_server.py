"""The uvicorn server that drains: a stop signal turns /ready 503 and lets the requests in flight finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from types import FrameType

import uvicorn

from service.server.supervision.lifecycle import Lifecycle, Phase

log = logging.getLogger("service")
CUT_WAIT_S = 5.0  # for the engine to abort the requests still in flight at shutdown, and for them to answer


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
