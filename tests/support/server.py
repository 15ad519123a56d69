"""Run the real service (`python -m service serve`) as a subprocess on a free loopback port."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_env(cache_dir: Path, **settings: str) -> dict[str, str]:
    """The environment a test server runs with: offline, eager (fast start), its own cache, given settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        SERVICE_CACHE_DIR=str(cache_dir),
        SERVICE_ENFORCE_EAGER="true",
    )
    env.update({f"SERVICE_{k.upper()}": v for k, v in settings.items()})
    return env


@dataclass
class ServerProcess:
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerProcess":
        env = dict(self.env, SERVICE_PORT=str(self.port), SERVICE_HOST="127.0.0.1")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service", "serve"],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout: float = 420) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_bytes()[-chars:].decode(errors="replace")

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)
        finally:
            self._log.close()

    def kill_group(self) -> None:
        """Leave nothing behind: the engine core and workers live in the server's process group."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
