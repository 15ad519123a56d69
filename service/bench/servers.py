"""The servers under test, each a subprocess on a free loopback port: our service, and vLLM's own OpenAI
server (with our policy's engine arguments and environment, or with vLLM's defaults)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from service.report import StartupReport
from service.server.engine import _flag  # the same flag spelling the service hands vLLM's parser

REPO = Path(__file__).resolve().parents[2]
VLLM_SERVER = "vllm.entrypoints.openai.api_server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env() -> dict[str, str]:
    """Offline, CPU, and nothing the policy sets: each server gets exactly what its side decides."""
    drop = ("SERVICE_", "VLLM_CPU_", "OMP_", "KMP_", "GOMP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def engine_flags(engine_args: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    for name, value in engine_args.items():
        flags += _flag(name, value)
    return flags


@dataclass
class Server:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready_path: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    started_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "Server":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, *[a.replace("{port}", str(self.port)) for a in self.argv]],
            cwd=REPO,
            env={k: v.replace("{port}", str(self.port)) for k, v in self.env.items()},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # engine core and workers stay in this group: stop() leaves nothing behind
        )
        return self

    def wait_ready(self, timeout: float = 900) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=5).status_code == 200:
                    self.started_s = time.monotonic() - self._t0
                    return self.started_s
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def api_cpu_s(self) -> float:
        """User + system CPU seconds of the server's own (API) process so far, children excluded."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_bytes()[-chars:].decode(errors="replace")

    def stop(self, timeout: float = 60) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self._log.close()


def ours(model: str, served: str, settings_env: dict[str, str], log_path: Path) -> Server:
    """`python -m service serve`: the startup policy runs inside it, as in production."""
    env = base_env()
    env.update(settings_env)
    env.update(SERVICE_MODEL=model, SERVICE_SERVED_MODEL_NAME=served, SERVICE_HOST="127.0.0.1", SERVICE_PORT="{port}")
    return Server("ours", ["-m", "service", "serve"], env, log_path, ready_path="/ready")


def vllm_with_policy(model: str, served: str, report: StartupReport, max_queued: int, log_path: Path) -> Server:
    """vLLM's own server with the engine arguments and environment our policy chose (report.plan)."""
    env = base_env()
    env.update(report.plan.env)
    argv = ["-m", VLLM_SERVER, "--model", model, "--served-model-name", served, "--host", "127.0.0.1", "--port", "{port}"]
    argv += engine_flags(report.plan.engine_args)
    if max_queued:
        argv += ["--max-num-queued-reqs", str(max_queued)]
    return Server("vllm", argv, env, log_path, ready_path="/v1/models")


def vllm_defaults(model: str, served: str, kv_cache_bytes: int | None, log_path: Path) -> Server:
    """vLLM's own server with its defaults, except the KV-cache size: vLLM's default claims 92% of the
    machine's memory (--gpu-memory-utilization 0.92), which refuses to start, or starves every other
    process, on a shared machine. It gets the same KV size as the policy chose."""
    argv = ["-m", VLLM_SERVER, "--model", model, "--served-model-name", served, "--host", "127.0.0.1", "--port", "{port}"]
    if kv_cache_bytes:
        argv += ["--kv-cache-memory-bytes", str(kv_cache_bytes)]
    return Server("vllm-defaults", argv, base_env(), log_path, ready_path="/v1/models")
