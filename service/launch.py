"""`python -m service launch claude|codex [-- ARGS]`: an installed agent client pointed at the running service. The
service's address and key come from its settings, the model and its context from its `GET /v1/models`; they become
Claude Code's environment or a Codex CLI config, said before the client runs."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.facts.api_key import api_key_of
from service.settings import Settings

CLIENTS = ("claude", "codex")
# Where `make agent-clients` (mk/agents.mk) installs the pinned clients, for a checkout without them on PATH.
REPO_CLIENTS = Path(__file__).resolve().parents[1] / ".cache" / "agent-clients" / "node_modules" / ".bin"
# The key stands in for a login both clients otherwise ask for; a service without one takes any.
NO_KEY = "unused"
CODEX_PROVIDER = "cpu-llm-service"
CODEX_KEY_VARIABLE = "SERVICE_API_KEY"
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class LaunchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Served:
    """What a client needs of the running service."""

    url: str  # http://host:port, no path
    key: str | None
    model: str
    max_model_len: int | None


def service_url(settings: Settings) -> str:
    """Where the service listens, as a client on this machine reaches it (a wildcard bind through loopback)."""
    host = _ANY_ADDRESS.get(settings.host, settings.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


def served_from(settings: Settings, models: Mapping[str, Any]) -> Served:
    """The settings and a `GET /v1/models` answer -> what the client is given: the base model's card (LoRA adapters
    are listed beside it with a parent)."""
    cards = [card for card in models.get("data") or [] if isinstance(card, dict) and not card.get("parent")]
    if not cards:
        raise LaunchError(f"{service_url(settings)}/v1/models lists no model: {json.dumps(models)[:300]}")
    length = cards[0].get("max_model_len")
    return Served(service_url(settings), api_key_of(settings).value, str(cards[0]["id"]), length)


def fetch_models(settings: Settings, timeout: float = 10) -> dict[str, Any]:
    """The service's `GET /v1/models`; a service that does not answer it is a LaunchError naming the address."""
    url = f"{service_url(settings)}/v1/models"
    key = api_key_of(settings).value
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return dict(json.load(answer))
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise LaunchError(f"the service at {url} answered {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise LaunchError(
            f"no service answers at {service_url(settings)} ({reason}): start it with `python -m service serve`, "
            "or give the host and port it runs on (SERVICE_HOST, SERVICE_PORT, --config)"
        ) from exc


def claude_environment(served: Served) -> dict[str, str]:
    """Claude Code's variables: the service as its Anthropic API, the served model as both its main and its small
    fast model, and no traffic to Anthropic's own hosts (telemetry, update checks), as the service sends none. Not
    the context as CLAUDE_CODE_MAX_CONTEXT_TOKENS: Claude Code sizes its prompt with its tools, which a template may
    leave out, and refused the default model's 8192 tokens before asking ("Prompt is too long")."""
    return {
        "ANTHROPIC_BASE_URL": served.url,
        "ANTHROPIC_AUTH_TOKEN": served.key or NO_KEY,
        "ANTHROPIC_MODEL": served.model,
        "ANTHROPIC_SMALL_FAST_MODEL": served.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def codex_config(served: Served) -> str:
    """Codex CLI's config.toml: the service as a provider speaking the Responses API, its model and context."""
    lines = [f"model = {json.dumps(served.model)}", f'model_provider = "{CODEX_PROVIDER}"']
    if served.max_model_len:
        lines.append(f"model_context_window = {served.max_model_len}")
    lines += [
        "",
        f"[model_providers.{CODEX_PROVIDER}]",
        f'name = "{CODEX_PROVIDER}"',
        f"base_url = {json.dumps(served.url + '/v1')}",
        'wire_api = "responses"',
        f'env_key = "{CODEX_KEY_VARIABLE}"',
    ]
    return "\n".join(lines) + "\n"


def codex_home(settings: Settings) -> Path:
    """Codex's home for the service, kept in the service's cache (its sessions stay for `codex resume`): not the
    user's ~/.codex, whose config names other providers. Not under /tmp, where Codex refuses its helper binaries."""
    return settings.cache_dir / "agent-clients" / "codex"


def masked(name: str, value: str, key: str | None) -> str:
    """`NAME=value` as printed: the key shows its first and last three characters."""
    return f"{name}={value[:3]}...{value[-3:]}" if key and value == key else f"{name}={value}"


def find_client(name: str, given: Path | None, path: str | None = None) -> Path:
    """The client's executable: the one given, else on PATH, else the checkout's pinned install."""
    if given is not None:
        if not (given.is_file() and os.access(given, os.X_OK)):
            raise LaunchError(f"{given} is not an executable file")
        return given
    found = shutil.which(name, path=path) or (str(REPO_CLIENTS / name) if (REPO_CLIENTS / name).is_file() else None)
    if found is None:
        package = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}[name]
        raise LaunchError(
            f"{name} is neither on PATH nor in {REPO_CLIENTS}: `make agent-clients` installs the pinned version "
            f"there, `npm install -g {package}` any; or name it with --client-path"
        )
    return Path(found)


@dataclass(frozen=True)
class Launch:
    env: dict[str, str]  # the client's whole environment
    said: list[str]  # what was set, as printed before it runs (the key masked)
    files: dict[Path, str]  # written before it runs


def prepare(name: str, settings: Settings, models: Mapping[str, Any], environ: Mapping[str, str]) -> Launch:
    """The client's environment and files from the settings, the service's `/v1/models` answer and the caller's
    environment. Claude Code is given no ANTHROPIC_API_KEY of the caller's: beside the token it is a conflict, and
    a real Anthropic key has no business going to this service."""
    served = served_from(settings, models)
    if name == "claude":
        variables = claude_environment(served)
        env = {k: v for k, v in environ.items() if k != "ANTHROPIC_API_KEY"} | variables
        return Launch(env, [masked(k, v, served.key) for k, v in variables.items()], {})
    home = codex_home(settings)
    config = codex_config(served)
    variables = {"CODEX_HOME": str(home), CODEX_KEY_VARIABLE: served.key or NO_KEY}
    said = [masked(k, v, served.key) for k, v in variables.items()]
    said += [f"{home / 'config.toml'}:", *(f"  {line}" for line in config.splitlines() if line)]
    return Launch(dict(environ) | variables, said, {home / "config.toml": config})
