"""The preload decision reaches the service's own process (re-executed once with it) and the engine processes vLLM
spawns: their memory maps hold the libraries the policy chose for the live CPU's backend, and vLLM's worker no longer
warns that they are missing."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import psutil
import pytest

from service.startup.self_preload import mapped_files

pytestmark = pytest.mark.engine

# What vLLM 0.32's CPU worker logs at start for each library missing from LD_PRELOAD (cpu_worker.py).
MISSING_WARNING = "{} is not found in LD_PRELOAD"


def engine_processes(server_pid: int) -> list[psutil.Process]:
    """The server's descendants that run torch: vLLM's engine core and its workers."""
    found = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if "libtorch_cpu" in open(f"/proc/{child.pid}/maps").read():
                found.append(child)
        except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


def test_the_service_and_its_engine_processes_carry_the_decided_preload(chat_server):
    report = httpx.get(f"{chat_server.url}/v1/hardware", headers=chat_server.headers()).json()
    decision = next(d for d in report["decisions"] if d["setting"] == "env.LD_PRELOAD")
    assert decision["source"] == "policy" and decision["value"], decision
    libraries = decision["value"].split(":")
    # The runtime follows the live CPU's backend: zentorch's GNU OpenMP on Zen, Intel OpenMP elsewhere.
    openmp = "libgomp" if report["backend"]["name"] == "zen" else "libiomp5"
    assert any(os.path.basename(p).startswith(openmp) for p in libraries), (report["backend"], libraries)

    server = psutil.Process(chat_server.process.proc.pid)
    procs = engine_processes(server.pid)
    assert len(procs) >= 2, "expected vLLM's engine core and at least one worker"
    for proc in [server, *procs]:
        maps = mapped_files(Path(f"/proc/{proc.pid}/maps").read_text())
        for lib in libraries:
            assert os.path.realpath(lib) in maps, f"{lib} not mapped in {proc.pid} {proc.cmdline()[:3]}"

    log = chat_server.process.log_path.read_text(errors="replace")
    assert "libtcmalloc" in decision["value"], "make setup installs tcmalloc (libtcmalloc-minimal4)"
    assert MISSING_WARNING.format("libtcmalloc") not in log
    assert log.count("executing the service again with LD_PRELOAD") == 1, "once: the re-executed process has them"
    if openmp == "libiomp5":
        assert MISSING_WARNING.format("libiomp") not in log
