"""Whether an engine start still makes progress. Until the engine core runs its loop there is nothing to probe
(engine_probe.py), and vLLM waits for the engine core's handshake with no limit while it loads: a start stuck in a
deadlock, a stopped process or a lock never released kept /health 200 and the service "starting" for ever, which
only a Kubernetes startup probe ended. A start that works uses CPU or moves data, so the service's process and
every process under it are sampled on each tick: a window of `stall_s` in which together they used under 5% of one
core, read or wrote under 16 MiB and changed their resident memory by under 16 MiB, with no process started or
ended, is a hang. Idle engine processes waiting on each other use about 1% (the demo model's, on a Xeon guest)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

IDLE_CPU_SHARE = 0.05  # of one core, over the window
MOVED_BYTES = 16 << 20  # read or written, or resident memory gained or freed, over the window
DISK_SLEEP = "disk-sleep"  # psutil's name for state D


@dataclass(frozen=True)
class Usage:
    """What the service's processes have used so far, together."""

    pids: frozenset[int]
    cpu_s: float
    io_bytes: int  # read and written, through any file or socket
    rss_bytes: int
    states: tuple[str, ...] = ()  # "VLLM::EngineCore (pid 12) stopped", for the reason


class StartWatch:
    def __init__(
        self, sample: Callable[[], Usage], stall_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._sample, self.stall_s, self._clock = sample, stall_s, clock
        self._samples: deque[tuple[float, Usage]] = deque()

    def look(self) -> str | None:
        """Called on each tick while the engine starts and warms up: why the start counts as hung, or None."""
        now, usage = self._clock(), self._sample()
        self._samples.append((now, usage))
        # The oldest sample kept is the newest one that is at least stall_s old: the window is [it, now].
        while len(self._samples) > 1 and now - self._samples[1][0] >= self.stall_s:
            self._samples.popleft()
        then, first = self._samples[0]
        span = now - then
        if span < self.stall_s or _progressed(first, usage, span):
            return None
        states = f": {', '.join(usage.states)}" if usage.states else ""
        return (
            f"engine start hung: in {span:.0f} s the service's processes used {usage.cpu_s - first.cpu_s:.1f} s of "
            f"CPU and moved {max(0, usage.io_bytes - first.io_bytes) >> 20} MiB (engine_stall_seconds "
            f"{self.stall_s:g}){states}"
        )


def _progressed(first: Usage, last: Usage, span: float) -> bool:
    # A process in uninterruptible disk sleep is waiting for the disk, not hung: a CI box building images beside a
    # start held a worker there for over 3 s (engine_stall_seconds 3) with nothing counted yet.
    return (
        any(state.endswith(f" {DISK_SLEEP}") for state in last.states)
        or first.pids != last.pids
        or last.cpu_s - first.cpu_s >= IDLE_CPU_SHARE * span
        or last.io_bytes - first.io_bytes >= MOVED_BYTES
        or abs(last.rss_bytes - first.rss_bytes) >= MOVED_BYTES
    )


def process_usage() -> Usage:
    """This process and every process under it, from /proc (psutil). A process that ends while it is read drops
    out of the sample. This process's CPU leaves out the calling thread's, the event loop's: it answers the probes
    (a client polling /health ten times a second added 1.6% of a core, measured on a ready demo server) and takes these samples, neither of
    which is the start's progress; the start itself runs in vLLM's processes and in this process's other threads."""
    import psutil

    me = psutil.Process()
    loop_thread = threading.get_native_id()
    pids, cpu_s, io_bytes, rss_bytes, states = set(), 0.0, 0, 0, []
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            with proc.oneshot():
                times, io, rss = proc.cpu_times(), proc.io_counters(), proc.memory_info().rss
                name, status = proc.name(), proc.status()
                threads = proc.threads() if proc is me else []
            pids.add(proc.pid)
            cpu_s += times.user + times.system
            cpu_s -= sum(t.user_time + t.system_time for t in threads if t.id == loop_thread)
            io_bytes += io.read_chars + io.write_chars
            rss_bytes += rss
            if proc is not me:
                states.append(f"{name} (pid {proc.pid}) {status}")
    return Usage(frozenset(pids), cpu_s, io_bytes, rss_bytes, tuple(states))
