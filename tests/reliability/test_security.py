"""Process-level security: keys compared in constant time and never logged; /v1/hardware, /version and
/metrics reveal no secrets or environment values; trust_remote_code off unless enabled; loopback bind by
default. (Non-root and read-only root filesystem are container properties: tests/container.)"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets

import httpx
import psutil
import pytest
from fastapi import Depends, FastAPI

from service.server.http.auth import require_api_key
from service.server.openai_compat.errors import install_error_handlers
from service.settings import Settings, load_settings
from tests.reliability.conftest import CANARIES, LISTED_ORIGIN, SERVED


@pytest.mark.engine
def test_keys_and_environment_never_leak_into_answers_or_logs(server):
    wrong = "wrong-" + secrets.token_hex(12)
    for key in (server.api_key, wrong):
        httpx.post(
            f"{server.url}/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": SERVED, "prompt": "hi", "max_tokens": 1},
        )
    answers = {
        path: httpx.get(f"{server.url}{path}", headers=server.headers()).text
        for path in ("/v1/hardware", "/version", "/metrics", "/v1/models", "/openapi.json")
    }
    secrets_ = {"api key": server.api_key, "wrong key": wrong, **CANARIES}
    for path, text in answers.items():
        assert text, path
        for name, value in secrets_.items():
            assert value not in text, f"{name} appears in {path}"
    log = server.log()
    assert "ready" in log  # the log is real and being written
    for name, value in secrets_.items():
        assert value not in log, f"{name} appears in the server log"
    # The key's digest is no better than the key.
    assert hashlib.sha256(server.api_key.encode()).hexdigest() not in log


@pytest.mark.engine
def test_the_engines_processes_inherit_no_hub_token(server):
    """The server starts with HF_TOKEN set (CANARIES); the model is fetched before vLLM's processes start, so none of
    them, nor any child of theirs, carries it."""
    children = psutil.Process(server.pid).children(recursive=True)
    assert children, "the engine's processes are the server's children"
    environs = [child.environ() for child in children]
    assert not [env for env in environs if "HF_TOKEN" in env]
    # The rest of the environment is there: what was read is the engine's real one.
    assert any(env.get("RELIABILITY_CANARY_SECRET") == CANARIES["RELIABILITY_CANARY_SECRET"] for env in environs)


@pytest.mark.engine
def test_trust_remote_code_is_off_and_the_socket_is_loopback_only(server):
    report = httpx.get(f"{server.url}/v1/hardware", headers=server.headers()).json()
    decision = next(d for d in report["decisions"] if d["setting"] == "engine.trust_remote_code")
    assert decision["value"] is False and decision["source"] == "default"
    listening = [c.laddr for c in psutil.Process(server.pid).net_connections(kind="inet") if c.status == "LISTEN"]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening


@pytest.mark.engine
@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1:8080", LISTED_ORIGIN])
def test_pages_on_this_machine_and_listed_ones_may_call_the_api_from_a_browser(server, origin):
    preflight = httpx.options(
        f"{server.url}/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200, preflight.text  # no API key: a browser sends none with a preflight
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    served = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Origin": origin, **server.headers()})
    assert served.status_code == 200 and served.headers["access-control-allow-origin"] == origin
    # A refusal carries the headers too: the page can read why.
    refused = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Origin": origin})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == origin


@pytest.mark.engine
@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null"])
def test_other_pages_may_not(server, origin):
    preflight = httpx.options(
        f"{server.url}/v1/chat/completions",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 400 and "access-control-allow-origin" not in preflight.headers
    answer = httpx.get(f"{server.url}/v1/models", headers={"Origin": origin, **server.headers()})
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers


@pytest.mark.parametrize(
    ("value", "origins"),
    [
        ("https://a.example, https://b.example", ["https://a.example", "https://b.example"]),
        ('["*"]', ["*"]),
        ("", []),
    ],
)
def test_cors_origins_come_as_a_comma_separated_or_json_list(monkeypatch, value, origins):
    monkeypatch.setenv("SERVICE_CORS_ORIGINS", value)
    assert Settings().cors_origins == origins


def test_defaults_bind_loopback_and_keep_remote_code_off(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SERVICE_"):
            monkeypatch.delenv(name)
    shipped = load_settings()  # configs/default.yaml, no environment, no flags
    assert shipped.host == "127.0.0.1" and shipped.trust_remote_code is False
    assert Settings.model_fields["host"].default == "127.0.0.1"
    assert Settings.model_fields["trust_remote_code"].default is False
    assert "0.0.0.0" not in repr(shipped.host)


def test_api_key_is_compared_in_constant_time(monkeypatch):
    """Every check compares SHA-256 digests (equal length whatever was sent) with secrets.compare_digest, the
    Bearer token's and x-api-key's both: time does not depend on how much of the key matched, on its length, or on
    which header carried it."""
    key = "k-" + secrets.token_hex(16)
    calls: list[tuple[bytes, bytes]] = []
    real = secrets.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("service.server.http.auth.secrets.compare_digest", spy)
    app = FastAPI()
    install_error_handlers(app, on_engine_dead=lambda: "engine died")

    @app.get("/v1/thing", dependencies=[Depends(require_api_key(key))])
    async def thing():
        return {"ok": True}

    guarded = app

    async def statuses():
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            out = []
            for offered in (key, key[:-1], key + "x", "x", "x" * 10_000, key[:8] + "0" * (len(key) - 8)):
                r = await client.get("/v1/thing", headers={"Authorization": f"Bearer {offered}"})
                out.append(r.status_code)
            return out

    assert asyncio.run(statuses()) == [200, 401, 401, 401, 401, 401]
    # Two comparisons per request, whichever header was sent: the Bearer token's and x-api-key's (Anthropic's).
    assert len(calls) == 12
    assert all(len(a) == len(b) == 32 for a, b in calls)
    assert all(b == hashlib.sha256(key.encode()).digest() for _, b in calls)
