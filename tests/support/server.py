"""The server harness of the tests: the shared one (harness/), plus the environment a test server runs with."""

from __future__ import annotations

from pathlib import Path

from harness import REPO, ServerProcess, free_port, offline_env

__all__ = ["REPO", "ServerProcess", "free_port", "service_env"]


def service_env(cache_dir: Path, **settings: str) -> dict[str, str]:
    """The environment a test server runs with: offline, eager (fast start), its own cache, given settings."""
    env = offline_env()
    env.update(SERVICE_CACHE_DIR=str(cache_dir), SERVICE_ENFORCE_EAGER="true")
    env.update({f"SERVICE_{k.upper()}": v for k, v in settings.items()})
    return env
