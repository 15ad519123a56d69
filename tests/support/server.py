"""The server harness of the tests: the shared one (harness/), plus the environment a test server runs with."""

from __future__ import annotations

from pathlib import Path

from harness import REPO, ServerProcess, free_port, offline_env
from service.demo_model import DEMO_NAME

__all__ = ["DEFAULT_MODEL", "REPO", "ServerProcess", "free_port", "service_env"]

# `model=DEFAULT_MODEL`: no model configured, the service's own default (SmolLM2-135M-Instruct).
DEFAULT_MODEL = ""


def service_env(cache_dir: Path, **settings: str) -> dict[str, str]:
    """The environment a test server runs with: offline, eager (fast start), its own cache, the demo model (the
    smallest engine) unless `model` is given, and the given settings."""
    env = offline_env()
    env.update(SERVICE_CACHE_DIR=str(cache_dir), SERVICE_ENFORCE_EAGER="true", SERVICE_MODEL=DEMO_NAME)
    env.update({f"SERVICE_{k.upper()}": v for k, v in settings.items()})
    return env
