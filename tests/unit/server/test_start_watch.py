"""The start watch: a window of `stall_s` in which the service's processes neither compute nor move data nor start
or end is a hung start; any one of those, however slow the start, is progress. And the sample of the live process
tree it reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from service.server.supervision.start_watch import IDLE_CPU_SHARE, MOVED_BYTES, StartWatch, Usage, process_usage

STALL_S = 60.0
CORE = "VLLM::EngineCore (pid 12) stopped"


class Tree:
    """A process tree whose usage each tick adds to, on a clock that ticks a second per look."""

    def __init__(self) -> None:
        self.now, self.usage = 0.0, Usage(frozenset({1, 12}), 10.0, 1 << 30, 2 << 30, (CORE,))

    def clock(self) -> float:
        return self.now

    def sample(self) -> Usage:
        return self.usage

    def run(self, watch: StartWatch, seconds: int, **per_second) -> list[str | None]:
        seen = []
        for _ in range(seconds):
            self.now += 1.0
            u = self.usage
            self.usage = Usage(
                u.pids | per_second.get("new_pids", frozenset()),
                u.cpu_s + per_second.get("cpu_s", 0.0),
                u.io_bytes + per_second.get("io_bytes", 0),
                u.rss_bytes + per_second.get("rss_bytes", 0),
                u.states,
            )
            seen.append(watch.look())
        return seen


def _watch(tree: Tree) -> StartWatch:
    return StartWatch(tree.sample, STALL_S, clock=tree.clock)


def test_an_idle_tree_is_hung_once_the_window_is_full_and_not_before():
    tree = Tree()
    watch = _watch(tree)
    seen = tree.run(watch, int(STALL_S) + 1, cpu_s=0.01)  # what idle engine processes use
    assert seen[: int(STALL_S) - 1] == [None] * (int(STALL_S) - 1)
    hung = seen[-1]
    assert hung is not None and hung.startswith("engine start hung: in 60 s"), hung
    assert "used 0.6 s of CPU" in hung and "moved 0 MiB" in hung and "engine_stall_seconds 60" in hung, hung
    assert hung.endswith(CORE), hung  # the processes' states: a stopped one is named


@pytest.mark.parametrize(
    "per_second",
    [
        {"cpu_s": 2 * IDLE_CPU_SHARE},  # computing, slowly
        {"io_bytes": 2 * MOVED_BYTES // int(STALL_S)},  # reading weights from a slow disk, or a download
        {"rss_bytes": 2 * MOVED_BYTES // int(STALL_S)},  # mapping weights in (a page fault reads no file)
        {"rss_bytes": -2 * MOVED_BYTES // int(STALL_S)},
    ],
    ids=["cpu", "io", "rss-up", "rss-down"],
)
def test_a_slow_start_that_progresses_is_never_hung(per_second):
    tree = Tree()
    watch = _watch(tree)
    assert tree.run(watch, 10 * int(STALL_S), **per_second) == [None] * 10 * int(STALL_S)


def test_a_process_waiting_on_the_disk_is_not_hung_however_long_its_tree_idles():
    tree = Tree()
    tree.usage = Usage(tree.usage.pids, 10.0, 1 << 30, 2 << 30, ("VLLM::Worker (pid 13) disk-sleep", CORE))
    assert tree.run(_watch(tree), 2 * int(STALL_S)) == [None] * (2 * int(STALL_S))


def test_a_process_that_starts_is_progress_and_the_window_restarts_from_the_idle_after_it():
    tree = Tree()
    watch = _watch(tree)
    assert tree.run(watch, 50) == [None] * 50
    assert tree.run(watch, 1, new_pids=frozenset({13})) == [None]  # the worker spawned
    seen = tree.run(watch, int(STALL_S))
    assert seen[:-1] == [None] * (int(STALL_S) - 1) and seen[-1] is not None, seen


def test_progress_is_measured_over_the_last_window_not_since_the_start():
    """A start that computed hard, then stopped: its early CPU does not cover the later stall."""
    tree = Tree()
    watch = _watch(tree)
    assert tree.run(watch, 100, cpu_s=1.0) == [None] * 100
    seen = tree.run(watch, int(STALL_S))
    # Hung once the window's seconds of computing (1 s each) make under 5% of it: 2 s of 60.
    first = next(i for i, hung in enumerate(seen) if hung is not None) + 1
    assert first == STALL_S - 2, seen
    assert "used 2.0 s of CPU" in seen[first - 1] and "used 0.0 s of CPU" in seen[-1], seen


def test_the_live_sample_counts_this_process_and_the_ones_under_it():
    spin = "import time\nend = time.thread_time() + 0.2\nwhile time.thread_time() < end: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        deadline = time.monotonic() + 30
        while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGSTOP)
        os.waitpid(child.pid, os.WUNTRACED)  # stopped by now
        usage = process_usage()
        assert {os.getpid(), child.pid} <= usage.pids
        assert usage.cpu_s >= 0.2 and usage.rss_bytes > 0 and usage.io_bytes > 0
        assert f"python (pid {child.pid}) stopped" in usage.states, usage.states
        assert not any(f"(pid {os.getpid()})" in state for state in usage.states)
    finally:
        child.kill()
        child.wait()


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_calling_threads_cpu_is_not_the_starts_and_another_threads_is():
    """The event loop takes the samples and answers /health (a client polling it ten times a second used a few % of
    a core: a stopped start never looked idle); the start's own work runs in other threads and processes."""
    before = process_usage().cpu_s
    _spin(0.3)  # on the calling thread
    after_loop = process_usage().cpu_s
    worker = threading.Thread(target=_spin, args=(0.3,))
    worker.start()
    worker.join()
    after_thread = process_usage().cpu_s
    assert after_loop - before < 0.1, (before, after_loop)
    assert after_thread - after_loop >= 0.25, (after_loop, after_thread)


def _titled(title: str) -> subprocess.Popen:
    """A real child process titled as vLLM titles its processes (setproctitle, a dependency of vLLM)."""
    code = f"import setproctitle, time; setproctitle.setproctitle({title!r}); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).name() != title:
        assert time.monotonic() < deadline, f"{child.pid} never titled itself {title}"
        time.sleep(0.05)
    return child


@pytest.mark.parametrize(("title", "ends_the_start"), [("VLLM::Worker", True), ("VLLM::EngineCore", False)])
def test_a_named_worker_that_ends_during_the_start_ends_it_with_exit_3(monkeypatch, title, ends_the_start):
    """A worker killed while vLLM's start waits on its engine core: the watch sees it gone at its next tick, where
    the engine core's own monitor was late on a loaded CPU (docs/reliability.md). An engine core's end is vLLM's to
    report (its exit code says how): the watch goes on."""
    import asyncio

    from service.server.supervision import watchdog
    from service.server.supervision.lifecycle import EXIT_ENGINE_DIED, Lifecycle, Phase

    monkeypatch.setattr(watchdog, "WATCHDOG_INTERVAL_S", 0.05)
    monkeypatch.setattr(watchdog, "DEAD_LINGER_S", 0.0)
    # Only the child stands for the engine's processes: the test process may have other children.
    child = _titled(title)
    tracked = psutil.Process(child.pid)
    monkeypatch.setattr(watchdog, "engine_processes", lambda: [] if child.poll() is not None else [tracked])
    killed: list[int] = []
    monkeypatch.setattr(watchdog, "_kill_descendants", lambda: killed.append(child.pid))
    lifecycle = Lifecycle()
    server = type("Server", (), {"should_exit": False, "force_exit": False})()

    async def scenario() -> None:
        watch = asyncio.create_task(watchdog.watch_start(lifecycle, server, 0.0))
        await asyncio.sleep(0.3)  # seen by several ticks, alive
        assert lifecycle.phase is Phase.STARTING
        child.kill()
        child.wait()
        await asyncio.wait({watch}, timeout=2.0)
        if not watch.done():
            lifecycle.set_phase(Phase.READY, "started")
            await asyncio.wait_for(watch, 2.0)

    try:
        asyncio.run(scenario())
    finally:
        child.kill()
    if ends_the_start:
        assert lifecycle.phase is Phase.DEAD and lifecycle.exit_code == EXIT_ENGINE_DIED
        assert lifecycle.reason == f"engine failed to start: an engine worker process (pid {child.pid}) ended"
        assert server.should_exit and killed == [child.pid]
    else:
        assert lifecycle.phase is Phase.READY and lifecycle.exit_code == 0 and not killed
