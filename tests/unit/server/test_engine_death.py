"""How the service words an engine's death (service/server/supervision/engine_death.py): from the exit codes of the engine
core processes vLLM's manager reaped and the worker processes that are gone."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import time
from types import SimpleNamespace

import psutil
import pytest

from service.facts.oom_kills import OomKills, read_oom_kills
from service.server.supervision.engine_death import OomSince, death_cause, describe, oom_since

OOM_HINT = "(the kernel's out-of-memory killer sends it, or a `kill -9`)"


@pytest.mark.parametrize(
    ("core_exits", "gone", "cause"),
    [
        ({"EngineCore_DP0": -9}, [], f"the engine core was killed by SIGKILL {OOM_HINT}"),
        # Its workers end with it: not named.
        ({"EngineCore_DP0": -15}, [41, 42], "the engine core was killed by SIGTERM"),
        ({"EngineCore_DP0": -99}, [], "the engine core was killed by signal 99"),
        # A worker ended, and the engine core exited after it.
        ({"EngineCore_DP0": 1}, [41], "an engine worker process (pid 41) ended; the engine core exited with code 1"),
        ({}, [41], "an engine worker process (pid 41) ended"),
        (
            {"EngineCore_DP0": 1, "EngineCore_DP1": -9},
            [],
            f"the engine core EngineCore_DP0 exited with code 1; the engine core EngineCore_DP1 was killed by "
            f"SIGKILL {OOM_HINT}",
        ),
        ({}, [], "the engine core reported a fatal error (the service log has its traceback)"),
    ],
)
def test_the_cause_names_what_ended_and_how(core_exits, gone, cause):
    assert describe(core_exits, gone) == cause


def _sleep() -> None:
    time.sleep(60)


def test_the_cause_is_read_from_the_real_processes():
    """A real multiprocessing.Process as vLLM's engine manager holds it, killed and reaped; a real worker process
    that ended; a live one, which is not named."""
    core = multiprocessing.get_context("fork").Process(target=_sleep, name="EngineCore_DP0")
    core.start()
    worker = subprocess.Popen(["sleep", "60"])
    processes = [psutil.Process(core.pid), psutil.Process(worker.pid), psutil.Process(os.getpid())]
    engine = SimpleNamespace(
        engine_core=SimpleNamespace(resources=SimpleNamespace(engine_manager=SimpleNamespace(processes=[core])))
    )
    try:
        assert (
            death_cause(engine, processes)
            == "the engine core reported a fatal error (the service log has its traceback)"
        )
        worker.kill()
        worker.wait()
        assert death_cause(engine, processes) == f"an engine worker process (pid {worker.pid}) ended"
        os.kill(core.pid, signal.SIGKILL)
        core.join()
        assert death_cause(engine, processes) == f"the engine core was killed by SIGKILL {OOM_HINT}"
    finally:
        for proc in (core, worker):
            proc.kill()


def test_an_engine_without_an_engine_manager_still_gets_a_cause():
    """vLLM's in-process engine (no engine core process), or one whose manager is gone after its shutdown."""
    assert death_cause(SimpleNamespace(), []).startswith("the engine core reported a fatal error")
    assert death_cause(None, []).startswith("the engine core reported a fatal error")


CGROUP_OOM = OomSince(1, "oom_kill 0 -> 1 in /sys/fs/cgroup/x/memory.events", "this cgroup")
NO_OOM = OomSince(0, "oom_kill 2 -> 2 in /proc/vmstat", "this machine")
MACHINE_OOM = OomSince(2, "oom_kill 3 -> 5 in /proc/vmstat", "this machine")


@pytest.mark.parametrize(
    ("core_exits", "gone", "oom", "cause"),
    [
        (
            {"EngineCore_DP0": -9},
            [],
            CGROUP_OOM,
            "the engine core was killed by SIGKILL, by the kernel's out-of-memory killer "
            "(oom_kill 0 -> 1 in /sys/fs/cgroup/x/memory.events)",
        ),
        (
            {"EngineCore_DP0": -9},
            [7],
            NO_OOM,
            "the engine core was killed by SIGKILL, not by the out-of-memory killer (oom_kill 2 -> 2 in /proc/vmstat): "
            "a `kill -9` or the container runtime",
        ),
        # The worker the OOM killer chose: its exit code is its parent's to read, the count is the kernel's.
        (
            {"EngineCore_DP0": 1},
            [7],
            CGROUP_OOM,
            "an engine worker process (pid 7) ended; the engine core exited with code 1; the kernel's out-of-memory "
            "killer killed 1 process(es) of this cgroup (oom_kill 0 -> 1 in /sys/fs/cgroup/x/memory.events)",
        ),
        (
            {"EngineCore_DP0": 1},
            [7],
            NO_OOM,
            "an engine worker process (pid 7) ended; the engine core exited with code 1",
        ),
        # A machine-wide count: another container's process may be the one killed, so the count is only reported.
        (
            {"EngineCore_DP0": -9},
            [7],
            MACHINE_OOM,
            "the engine core was killed by SIGKILL; the kernel's out-of-memory killer killed 2 process(es) of this "
            "machine (oom_kill 3 -> 5 in /proc/vmstat)",
        ),
    ],
)
def test_the_oom_kill_count_says_whether_the_out_of_memory_killer_did_it(core_exits, gone, oom, cause):
    assert describe(core_exits, gone, oom) == cause


def test_the_oom_kill_count_is_read_from_the_narrowest_file_that_has_it(tmp_path):
    v2, v1, vmstat = tmp_path / "v2", tmp_path / "v1", tmp_path / "vmstat"
    for directory in (v2, v1):
        directory.mkdir()
    vmstat.write_text("nr_free_pages 1000\noom_kill 5\n")
    assert read_oom_kills(None, None, vmstat) == OomKills(5, str(vmstat), "this machine")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert read_oom_kills(v2, v1, vmstat) == OomKills(2, str(v1 / "memory.oom_control"), "this cgroup")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert read_oom_kills(v2, v1, vmstat) == OomKills(1, str(v2 / "memory.events"), "this cgroup")
    # A kernel without the counter (before 4.13): nothing is known.
    vmstat.write_text("nr_free_pages 1000\n")
    assert read_oom_kills(None, None, vmstat) is None
    assert read_oom_kills(None, None, tmp_path / "absent") is None
    (v2 / "memory.events").write_text("oom_kill x\n")
    with pytest.raises(ValueError, match="memory.events holds 'x', not a whole number"):
        read_oom_kills(v2, None, vmstat)


def test_counts_from_different_files_or_unknown_ones_say_nothing():
    assert oom_since(OomKills(0, "/a", "this cgroup"), OomKills(1, "/b", "this cgroup")) is None
    assert oom_since(None, OomKills(1, "/a", "this cgroup")) is None
    assert oom_since(OomKills(0, "/a", "this cgroup"), OomKills(2, "/a", "this cgroup")) == OomSince(
        2, "oom_kill 0 -> 2 in /a", "this cgroup"
    )


def test_this_machines_count_is_read():
    """The live files of the machine in hand: /proc/vmstat has the counter on every kernel since 4.13."""
    from service.facts.oom_kills import live_oom_kills

    live = live_oom_kills()
    assert live is not None and live.count >= 0 and live.scope in ("this cgroup", "this machine"), live


def test_a_worker_seen_during_the_start_is_named_once_it_ended():
    """The start watch remembers each engine process it sees (vLLM's start returns none): one seen twice is kept
    once, and one that ended is named in the cause."""
    from service.server.supervision.lifecycle import Lifecycle

    worker, other = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        lifecycle = Lifecycle()
        lifecycle.remember_engine_processes([psutil.Process(worker.pid)])
        lifecycle.remember_engine_processes([psutil.Process(worker.pid), psutil.Process(other.pid)])
        assert [proc.pid for proc in lifecycle.engine_processes] == [worker.pid, other.pid]
        worker.kill()
        worker.wait()
        assert death_cause(None, lifecycle.engine_processes) == f"an engine worker process (pid {worker.pid}) ended"
    finally:
        for proc in (worker, other):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_child_multiprocessing_started_counts_as_an_engine_process_before_vllm_names_it(method):
    """vLLM's processes are started by multiprocessing (spawned, or forked: service/in_vllm/worker_start.py) and named
    "VLLM::..." only later; a child that is neither is not one of them."""
    from service.server.supervision.engine_processes import is_vllm_process as _is_vllm_process

    started = multiprocessing.get_context(method).Process(target=_sleep)
    started.start()
    other = subprocess.Popen(["sleep", "60"])
    try:
        # start() returns once forked; the exec that names a spawned child comes after (seconds later in a busy image).
        deadline = time.monotonic() + 30
        while not _is_vllm_process(psutil.Process(started.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _is_vllm_process(psutil.Process(started.pid))
        assert not _is_vllm_process(psutil.Process(other.pid))
    finally:
        started.kill()
        started.join()
        other.kill()
        other.wait()
