"""Who may use the API (policy/exposure/access.py) from the key as read (facts/api_key.py), and the Host check of a keyless
loopback service (server/host_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from service.facts.api_key import MIN_KEY_LENGTH, ApiKey, read_api_key
from service.policy.exposure.access import checked_host_names, is_loopback, plan_access
from service.policy.exposure.telemetry import plan_telemetry
from service.server.http.host_check import HostCheckMiddleware, host_name
from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED

KEY = "k" * MIN_KEY_LENGTH
NO_KEY = ApiKey(None, "none")


@pytest.mark.parametrize("text", ["", "\n", "   \t\n"])
def test_a_key_file_that_holds_no_key_is_a_problem_not_no_key(text, tmp_path):
    path = tmp_path / "api_key"
    path.write_text(text)
    key = read_api_key(None, path)
    assert key.value is None and "holds no key" in key.problem and str(path) in key.problem


def test_a_missing_key_file_or_a_short_key_is_a_problem(tmp_path):
    assert "cannot be read" in read_api_key(None, tmp_path / "absent").problem
    short = read_api_key("change-me", None)
    assert short.value is None and f"at least {MIN_KEY_LENGTH}" in short.problem
    (tmp_path / "k").write_text(KEY[:-1] + "\n")
    assert read_api_key(None, tmp_path / "k").problem is not None
    (tmp_path / "k").write_text(KEY + "\n")
    assert read_api_key(None, tmp_path / "k") == ApiKey(KEY, f"api_key_file {tmp_path / 'k'}")
    assert read_api_key(KEY + "env", tmp_path / "absent").value == KEY + "env"  # the variable wins over the file
    assert read_api_key(None, None) == NO_KEY


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_without_a_key_is_served_with_the_host_check(host):
    result = plan_access(host, NO_KEY, False, ["my-box.local"])
    assert result.ok and not result.warnings
    (decision,) = result.decisions
    assert decision.value == "none (loopback)" and "403" in decision.reason
    assert checked_host_names(host, NO_KEY, ["My-Box.local"]) == ("localhost", "127.0.0.1", "[::1]", "my-box.local")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "my-box.example.com"])
def test_off_loopback_without_a_key_is_refused_unless_a_proxy_is_said_to_authenticate(host):
    assert not is_loopback(host)
    (error,) = plan_access(host, NO_KEY, False, []).errors
    assert host in error and "SERVICE_API_KEY_FILE" in error and "SERVICE_ALLOW_UNAUTHENTICATED" in error
    allowed = plan_access(host, NO_KEY, True, [])
    assert allowed.ok and len(allowed.warnings) == 1 and "without an API key" in allowed.warnings[0]
    assert checked_host_names(host, NO_KEY, []) is None  # the proxy in front names the hosts


def test_a_key_opens_every_host_and_a_bad_key_refuses_anywhere(tmp_path):
    key = ApiKey(KEY, "SERVICE_API_KEY")
    for host in ("0.0.0.0", "127.0.0.1"):
        result = plan_access(host, key, False, [])
        assert result.ok and result.decisions[0].value == "required"
        assert checked_host_names(host, key, []) is None
        bad = ApiKey(None, "api_key_file x", "the api_key_file x holds no key")
        assert plan_access(host, bad, True, []).errors == ("API key: the api_key_file x holds no key",)


def _checked_app() -> TestClient:
    ok = PlainTextResponse("ok")
    app = Starlette(routes=[Route(p, lambda request: ok) for p in ("/v1/models", "/health", "/ready", "/metrics")])
    return TestClient(HostCheckMiddleware(app, checked_host_names("127.0.0.1", NO_KEY, ["box.lan"])))


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST", "box.lan:80"])
def test_the_local_names_are_answered(host):
    assert _checked_app().get("/v1/models", headers={"host": host}).status_code == 200


@pytest.mark.parametrize("host", ["attacker.example:8000", "localhost.attacker.example", "127.0.0.1.nip.io", ""])
def test_a_foreign_host_gets_403_in_openai_shape_but_probes_stay_open(host):
    client = _checked_app()
    response = client.get("/v1/models", headers={"host": host})
    assert response.status_code == 403
    error = response.json()["error"]
    assert (
        error["code"] == 403
        and error["type"] == "PermissionDeniedError"
        and "SERVICE_ALLOWED_HOSTS" in error["message"]
    )
    assert client.get("/metrics", headers={"host": host}).status_code == 403
    for probe in ("/health", "/ready"):
        assert client.get(probe, headers={"host": host}).status_code == 200


def test_host_names_lose_their_port():
    assert [host_name(h) for h in ("a:1", "[::1]:8000", "[::1]", "B.example", "::1")] == [
        "a",
        "[::1]",
        "[::1]",
        "b.example",
        "::1",
    ]


def test_usage_statistics_are_off_in_the_plan_unless_the_user_set_them():
    plan = plan_telemetry({})
    assert {d.name: d.value for d in plan.decisions if d.passed} == {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    kept = plan_telemetry({"DO_NOT_TRACK": "0"})
    assert {d.name: (d.value, d.source, d.passed) for d in kept.decisions}["DO_NOT_TRACK"] == ("0", "user", False)


@pytest.mark.parametrize("case", ["empty key file", "0.0.0.0 without a key"])
def test_serve_refuses_to_start_open(case, tmp_path):
    """Through the real start: the refusal comes before any model is read or engine started."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    env |= {"SERVICE_CACHE_DIR": str(tmp_path / "cache"), "SERVICE_MODEL": "demo-tiny-llama"}
    args = ["--port", "1"]
    if case == "empty key file":
        (tmp_path / "api_key").write_text("\n")
        env["SERVICE_API_KEY_FILE"] = str(tmp_path / "api_key")
    else:
        args += ["--host", "0.0.0.0"]
    out = subprocess.run(
        [sys.executable, "-m", "service", "serve", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == EXIT_STARTUP_REFUSED, out.stderr[-3000:]
    assert "refusing to start" in out.stderr and ("holds no key" in out.stderr or "without an API key" in out.stderr)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("/srv/cache/cpu-llm-service/models/gguf/ab12-float32", "ab12-float32"),
        ("sql=/srv/adapters/sql,poet=/srv/adapters/poet", "sql=sql,poet=poet"),
        ("cannot read /sys/fs/cgroup/cpu.max (Permission denied)", "cannot read cpu.max (Permission denied)"),
        ("model '/models/x.Q4_0.gguf': not found", "model 'x.Q4_0.gguf': not found"),
        ("see http://example.com/docs/a and 1/2 of a/b", "see http://example.com/docs/a and 1/2 of a/b"),
        ("/usr/lib/libtcmalloc.so.4:/venv/torch/lib/libgomp.so.1", "libtcmalloc.so.4:libgomp.so.1"),
    ],
)
def test_what_anyone_may_read_names_no_path(text, shown):
    from service.server.http.redact import without_paths

    assert without_paths(text) == shown


def test_requests_are_bounded_by_the_queue_limit_with_room_for_the_engines_own_refusals():
    from service.server.http.request_cap import request_limit

    assert request_limit(0) is None  # no queue cap: no request cap either
    for queued in (1, 8, 64):
        limit = request_limit(queued)
        # The reliability suite's overload sends 4x the admitted count: the engine's OpenAI-shaped 503 answers it.
        assert 4 * queued <= limit <= 16 * queued


def test_no_remote_media_unless_listed_and_never_a_redirect():
    """vLLM's own media connector with the plan's values: a private address (the cloud metadata service) is refused
    before any connection; a listed domain is the user's."""
    from vllm.multimodal.media.connector import MediaConnector

    from service.policy.exposure.media import plan_media

    plan = plan_media([])
    assert plan.env == {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"}
    connector = MediaConnector(allowed_media_domains=plan.engine_args["allowed_media_domains"])
    for url in ("http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/x.png", "https://example.com/cat.png"):
        with pytest.raises(ValueError, match="allowed domains"):
            connector.fetch_image(url)
    assert plan_media(["images.example.com"]).engine_args == {"allowed_media_domains": ["images.example.com"]}


def test_the_env_example_offers_no_literal_key():
    """`SERVICE_API_KEY=change-me` copied into .env overrode the generated secret with a guessable key."""
    from pathlib import Path

    example_file = Path(__file__).resolve().parents[3] / ".env.example"
    if not example_file.is_file():
        pytest.skip(".env.example is not in the test image's build context")
    example = example_file.read_text()
    assert not [line for line in example.splitlines() if line.lstrip("# ").startswith("SERVICE_API_KEY=")]


def test_detect_shows_what_serve_would_refuse_without_failing(tmp_path):
    """An image's `detect` runs without the key its deployment mounts: the refusal is serve's, shown as a warning."""
    from service.settings import Settings
    from service.startup import build_report

    report = build_report(Settings(host="0.0.0.0", cache_dir=tmp_path), model=None)
    assert report.ok, report.errors
    assert any(w.startswith("serve refuses to start: serving on 0.0.0.0 without an API key") for w in report.warnings)
