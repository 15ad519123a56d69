"""Who may use the API: a key, or loopback alone. Decided from the bind address, the key as read
(facts/api_key.py) and two settings, so that a deployment that forgot a setting stays closed: an unusable key file
refuses the start, and so does a non-loopback address without a key unless the user says a proxy authenticates.
Without a key on loopback, the Host header is checked (host_check.py): a web page that rebinds its own name to
127.0.0.1 (Ollama's CVE-2024-28224) sends its own name as Host, and is refused."""

from __future__ import annotations

import ipaddress

from service.facts.api_key import ApiKey
from service.policy.plan.decision import PolicyResult, record

LOCAL_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def checked_host_names(host: str, key: ApiKey, allowed_hosts: list[str]) -> tuple[str, ...] | None:
    """The Host names answered, or None when every Host is (a key guards the API, or a proxy in front does)."""
    if key.value is None and is_loopback(host):
        return (*LOCAL_HOST_NAMES, *(name.lower() for name in allowed_hosts))
    return None


def plan_access(host: str, key: ApiKey, allow_unauthenticated: bool, allowed_hosts: list[str]) -> PolicyResult:
    if key.problem is not None:
        return PolicyResult.of(errors=[f"API key: {key.problem}"])
    if key.value is not None:
        why = f"from {key.source}: every route but the probes, /version and /metrics needs it"
        return PolicyResult.of(record("access", "api_key", "required", why, "user"))
    if is_loopback(host):
        names = ", ".join(checked_host_names(host, key, allowed_hosts) or ())
        why = (
            f"no key, on loopback ({host}): only this machine reaches the port, and requests whose Host header is not "
            f"one of {names} (allowed_hosts adds names) get 403, against DNS rebinding"
        )
        return PolicyResult.of(record("access", "api_key", "none (loopback)", why, "default"))
    if allow_unauthenticated:
        warning = (
            f"serving on {host} without an API key (allow_unauthenticated): anyone who reaches the port may use the "
            "model and load adapters; only an authenticating proxy in front keeps it closed"
        )
        why = "allow_unauthenticated set by the user: a proxy in front authenticates"
        return PolicyResult.of(record("access", "api_key", "none", why, "user"), warnings=[warning])
    error = (
        f"serving on {host} without an API key would open the API to anyone who reaches the port: set "
        "SERVICE_API_KEY_FILE (or SERVICE_API_KEY), listen on 127.0.0.1, or set SERVICE_ALLOW_UNAUTHENTICATED=true "
        "behind an authenticating proxy"
    )
    return PolicyResult.of(errors=[error])
