"""One server process on a free loopback port: our service (`python -m service serve`), vLLM's own OpenAI server or
llama.cpp's `llama-server`, from an argv and an environment in which "{port}" stands for the port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


# The service as `make serve` runs it; host and port as flags, so the environment is the caller's alone.
SERVICE_ARGV = python_module("service", "serve", "--host", "127.0.0.1", "--port", "{port}")


def offline_env(base: Mapping[str, str] = os.environ, drop: Sequence[str] = ("SERVICE_",)) -> dict[str, str]:
    """`base` without the variables named by the prefixes in `drop`, offline (no hub), vLLM on its CPU build."""
    env = {k: v for k, v in base.items() if not k.startswith(tuple(drop))}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


@dataclass
class ServerProcess:
    """`ServerProcess(env, log_path).start()` runs the service; other servers give their `argv` and `ready_path`."""

    env: dict[str, str]
    log_path: Path
    argv: list[str] = field(default_factory=lambda: list(SERVICE_ARGV))
    ready_path: str = "/ready"
    name: str = "service"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    started_s: float | None = None  # start to ready
    ready_statuses: list[tuple[int, Any]] = field(default_factory=list)  # the ready path's answers while starting

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.proc.pid

    def start(self) -> ServerProcess:
        port = str(self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [a.replace("{port}", port) for a in self.argv],
            cwd=REPO,
            env={k: v.replace("{port}", port) for k, v in self.env.items()},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # A process group of its own, so kill_group() leaves no engine core or worker behind, but the caller's
            # session: Linux schedules each session as one group (autogroup), and vLLM's engine core, which spins
            # on sched_yield while its worker computes, kept clients in another group off the CPU for seconds.
            process_group=0,
        )
        return self

    def wait_ready(self, timeout: float = 420, interval: float = 0.5) -> float:
        """Seconds from start to the first 200 on the ready path; every answer seen on the way is recorded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                resp = httpx.get(self.url + self.ready_path, timeout=5)
            except httpx.HTTPError:
                resp = None
            if resp is not None:
                try:
                    body: Any = resp.json()
                except ValueError:
                    body = resp.text
                self.ready_statuses.append((resp.status_code, body))
                if resp.status_code == 200:
                    self.started_s = time.monotonic() - self._t0
                    return self.started_s
            time.sleep(interval)
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def api_cpu_s(self) -> float:
        """CPU seconds of the server's own process so far, all its threads (the API server; children excluded), to
        the nanosecond: Linux's per-process CPU-time clock, which another process of the same user may read
        (clock id `~pid << 3 | CPUCLOCK_SCHED`). /proc/<pid>/stat counts in ticks of 10 ms, a coarse step for a run
        of a few requests at tens of ms each."""
        return time.clock_gettime(~self.pid << 3 | 2)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_bytes()[-chars:].decode(errors="replace")

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM to the server process (as `docker stop` sends it), its exit code; the group is killed if it
        does not exit within `timeout`."""
        if self.proc is None:
            return None
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    return self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.kill_group()
                    return self.proc.wait(10)
            return self.proc.returncode
        finally:
            self._log.close()

    def kill_group(self) -> None:
        """Leave nothing behind: the engine core and workers live in the server's process group."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        self.stop()
        self.kill_group()
