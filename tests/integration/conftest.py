"""One real server per model for the integration tests (engine start costs ~40-60 s each). Package-scoped, not
session-scoped: an engine holds its KV cache in resident memory (the demo's 2 GiB on a Zen 4 guest), and servers
kept until the session's end left the reliability suite's own servers 4 GiB of 23.5 (they refused to start)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.release import release
from tests.support.server import DEFAULT_MODEL, MODELS, ServerProcess, start_service
from tests.support.tiny_models import tiny_qwen3_next

API_KEY = "test-key-7f3a9c-5e21d0"


@dataclass
class RunningServer:
    process: ServerProcess
    served_model: str
    api_key: str | None

    @property
    def ready_statuses(self) -> list[tuple[int, Any]]:
        """/ready answers seen while starting."""
        return self.process.ready_statuses

    @property
    def url(self) -> str:
        return self.process.url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def _start(name: str, tmp_root: Path, served: str, api_key: str | None = None, **settings: str) -> RunningServer:
    if api_key:
        settings["api_key"] = api_key
    log = tmp_root / f"{name.replace('/', '-')}.log"
    return RunningServer(start_service(log, name=name, **settings), served, api_key)


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="package")
def chat_server(server_logs):
    """The built-in demo model, as `make serve` runs it, with an API key configured."""
    server = _start("chat", server_logs, "demo-tiny-llama", api_key=API_KEY)
    yield server
    release(server.process)


@pytest.fixture(scope="package")
def default_server(server_logs):
    """No model configured, as `make serve` runs: the default model, SmolLM2-135M-Instruct."""
    server = _start("default", server_logs, "SmolLM2-135M-Instruct", model=DEFAULT_MODEL, kv_cache_gib="0.5")
    yield server
    release(server.process)


@pytest.fixture(scope="package")
def gdn_server(server_logs):
    model = tiny_qwen3_next(MODELS)
    server = _start("gdn", server_logs, "tiny-qwen3-next", model=str(model), served_model_name="tiny-qwen3-next")
    yield server
    release(server.process)
