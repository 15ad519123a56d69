"""How the service words an engine's death (service/server/engine_death.py): from the exit codes of the engine
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

from service.server.engine_death import death_cause, describe

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
