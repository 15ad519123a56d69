"""The API key as configured: from SERVICE_API_KEY or the key file, and what is wrong with it. A key file that is
missing, empty or holds only whitespace is a problem, not "no key": a Kubernetes Secret created empty or a file cut
short by a script would otherwise open the whole API without a word."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.settings import Settings

MIN_KEY_LENGTH = 16  # a key short enough to guess or to be a placeholder ("change-me", "sk-local") is refused


@dataclass(frozen=True)
class ApiKey:
    value: str | None  # None: no key configured (or an unusable one: see problem)
    source: str  # "SERVICE_API_KEY", "api_key_file /run/secrets/api_key", or "none"
    problem: str | None = None


def read_api_key(value: str | None, file: Path | None) -> ApiKey:
    """`value`: SERVICE_API_KEY (None: unset; it wins over the file); `file`: the key file, read stripped."""
    if value is not None:
        return _checked(value, "SERVICE_API_KEY")
    if file is None:
        return ApiKey(None, "none")
    source = f"api_key_file {file}"
    try:
        text = file.read_text()
    except OSError as exc:
        return ApiKey(None, source, f"the {source} cannot be read ({exc.strerror or exc})")
    if not text.strip():
        return ApiKey(None, source, f"the {source} holds no key (it is empty or whitespace), which would open the API")
    return _checked(text.strip(), source)


def _checked(key: str, source: str) -> ApiKey:
    if len(key.strip()) < MIN_KEY_LENGTH:
        why = f"the key from {source} has {len(key.strip())} characters; at least {MIN_KEY_LENGTH} are required"
        return ApiKey(None, source, f"{why} (`openssl rand -hex 32` makes one)")
    return ApiKey(key, source)


def api_key_of(settings: Settings) -> ApiKey:
    value = settings.api_key.get_secret_value() if settings.api_key is not None else None
    return read_api_key(value, settings.api_key_file)
