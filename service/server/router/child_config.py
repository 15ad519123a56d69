"""What a listed model's engine is started with: a config file of the settings the user set (the service-wide ones
with the entry's own over them), its planned KV cache, a loopback port and a key of its own.

Only the user's settings are written: the child's policy then decides the rest and says "policy", as for one model.
The key is the router's and the child's alone, so the child's port, on loopback, serves no one else."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from service.settings import Settings

# The router's own settings: the child listens where the router says, with the router's key.
_ROUTER_ONLY = frozenset(
    {"host", "port", "api_key", "api_key_file", "models", "max_loaded_models", "model_cpus", "model_load_wait_seconds"}
)


def child_settings(own: Settings, name: str, kv_cache_bytes: int | None, port: int) -> dict:
    """`own`: the router's settings as this entry's engine takes them (Settings.for_listed)."""
    chosen = {
        field: value
        for field, value in own.model_dump(mode="json").items()
        if field in own.explicitly_set() and field not in _ROUTER_ONLY
    }
    chosen["served_model_name"] = name
    if own.kv_cache_gib is None and kv_cache_bytes:
        chosen["kv_cache_gib"] = round(kv_cache_bytes / 2**30, 3)  # its share of the memory plan
    return chosen | {"host": "127.0.0.1", "port": port}


def child_env(base: Mapping[str, str], config: Path, key: str) -> dict[str, str]:
    """The router's environment without its SERVICE_* variables (written into `config` already)."""
    env = {k: v for k, v in base.items() if not k.startswith("SERVICE_")}
    return env | {"SERVICE_CONFIG": str(config), "SERVICE_API_KEY": key}


def write_config(directory: Path, name: str, values: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{_file_name(name)}.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=True))
    os.chmod(path, 0o600)
    return path


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
