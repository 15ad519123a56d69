"""Whether the engine core still answers. A hung one (stuck in a kernel or a deadlock, stopped) is alive to the
process table and to vLLM's health check, which asks only whether it has died: /health stayed 200 and every
request waited for ever. The probe is one of vLLM's utility calls, which the engine core answers between steps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

PROBE_INTERVAL_S = 5.0  # between one answer and the next probe: a round trip the engine core barely notices


class HangProbe:
    def __init__(
        self, ask: Callable[[], Awaitable[Any]], stall_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ask, self.stall_s, self._clock = ask, stall_s, clock
        self._pending: asyncio.Future[Any] | None = None
        self._sent_at = self._answered_at = clock()

    def look(self) -> str | None:
        """Called on each of the watchdog's ticks: sends a probe when none is pending and the last answer is
        PROBE_INTERVAL_S old. The reason the engine core counts as hung, or None."""
        now = self._clock()
        if self._pending is not None and self._pending.done():
            # A probe that raised means the engine died: vLLM's errored flag tells the watchdog that.
            if not self._pending.cancelled():
                self._pending.exception()
            self._pending, self._answered_at = None, now
        if self._pending is None:
            if now - self._answered_at >= PROBE_INTERVAL_S:
                self._pending, self._sent_at = asyncio.ensure_future(self._ask()), now
            return None
        waited = now - self._sent_at
        if waited < self.stall_s:
            return None
        return (
            f"engine core hung: it has answered no probe for {waited:.0f} s (engine_stall_seconds "
            f"{self.stall_s:g}), in the middle of a step or stopped"
        )

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
