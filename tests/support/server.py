"""The server harness of the tests: the shared one (harness/), plus the environment a test server runs with."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness import REPO, ServerProcess, free_port, offline_env
from service.in_vllm.plugin import STATE_PREFIX
from service.models.demo_model import DEMO_NAME
from tests.support.release import reap

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "REPO",
    "ServerProcess",
    "free_port",
    "service_env",
    "start_service",
    "start_table",
    "watch_until_exit",
]

# Test models, converted GGUF files and compile caches of the test servers. TEST_MODELS_DIR moves them where the
# repository is read-only (the test image).
MODELS = Path(os.environ.get("TEST_MODELS_DIR") or REPO / ".cache" / "test-models")

# `model=DEFAULT_MODEL`: no model configured, the service's own default (SmolLM2-135M-Instruct).
DEFAULT_MODEL = ""


def service_env(cache_dir: Path, **settings: str) -> dict[str, str]:
    """The environment a test server runs with: offline, eager (fast start), its own cache, the demo model (the
    smallest engine) unless `model` is given, the built-in table's speed decisions (no calibration: what a test
    expects of the policy does not hang on timings) unless `calibrate` is given, and the given settings."""
    env = offline_env()
    env.update(
        SERVICE_CACHE_DIR=str(cache_dir), SERVICE_ENFORCE_EAGER="true", SERVICE_MODEL=DEMO_NAME, SERVICE_CALIBRATE="off"
    )
    env.update({f"SERVICE_{k.upper()}": v for k, v in settings.items()})
    return env


def start_service(
    log_path: Path, *, name: str, extra_env: dict[str, str] | None = None, **settings: str
) -> ServerProcess:
    """`python -m service serve` with `service_env(MODELS, **settings)` (and `extra_env` over it), ready; nothing of
    it left running when it does not get there. `name`: the engine's, as tests/support/engines.py registers it."""
    return _ready(ServerProcess(service_env(MODELS, **settings) | (extra_env or {}), log_path, name=name))


def start_table(
    log_path: Path, *, name: str, models: list[dict], unset: tuple[str, ...] = (), **settings: str
) -> ServerProcess:
    """`python -m service serve` with a model table (`models`) instead of one model, ready (its pinned models loaded);
    nothing of it left running when it does not get there. `unset`: variables of this process its table goes without."""
    env = service_env(MODELS, models=json.dumps(models), **settings)
    for variable in ("SERVICE_MODEL", *unset):
        env.pop(variable, None)
    return _ready(ServerProcess(env, log_path, name=name))


def _ready(process: ServerProcess) -> ServerProcess:
    reap()  # its KV cache is sized from the memory free now
    process.start()
    try:
        process.wait_ready(timeout=480)
    except BaseException:
        process.kill_group()
        raise
    return process


@dataclass(frozen=True)
class Exit:
    health_503_after: float | None  # seconds from `since` to the first /health 503, None if none was seen
    code: int | None  # the server's exit code, None if it had not exited by the deadline
    after: float  # seconds from `since` to its exit (or to the deadline)


def watch_until_exit(process: ServerProcess, since: float, deadline_s: float) -> Exit:
    """After a fault at `since` (time.monotonic()): poll /health until the server exits or `deadline_s` passes."""
    health_503_after = None
    while process.proc.poll() is None and time.monotonic() - since < deadline_s:
        try:
            if health_503_after is None and httpx.get(f"{process.url}/health", timeout=1).status_code == 503:
                health_503_after = time.monotonic() - since
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    try:
        code = process.proc.wait(timeout=max(0.1, deadline_s - (time.monotonic() - since)))
    except Exception:  # subprocess.TimeoutExpired: still running at the deadline
        code = None
    return Exit(health_503_after, code, time.monotonic() - since)


def process_states(log: str) -> list[dict]:
    """The state line each vLLM process logs from the service's general plugin (service/in_vllm/plugin.py)."""
    return [json.loads(line.split(STATE_PREFIX, 1)[1]) for line in log.splitlines() if STATE_PREFIX in line]


def forked(state: dict) -> bool:
    """A vLLM process forked from its parent (service/in_vllm/worker_start.py): it inherits what the plugin did there."""
    return state["forked"]
