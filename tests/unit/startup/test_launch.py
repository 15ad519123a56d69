"""`python -m service launch claude|codex`: the settings and the service's /v1/models card -> the client's environment
or config; the client found; a service that does not answer; the command itself with a stand-in client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness import REPO, free_port
from service import launch
from service.settings import Settings

KEY = "k3y-for-the-launch-tests-0123"
CARD = {"id": "Qwen3-0.6B", "object": "model", "parent": None, "max_model_len": 40960}
ADAPTER = {"id": "sql-lora", "object": "model", "parent": "Qwen3-0.6B", "max_model_len": 40960}
MODELS = {"object": "list", "data": [ADAPTER, CARD]}


def settings(tmp_path: Path, **values) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", **values)


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8123"),
        ("0.0.0.0", "http://127.0.0.1:8123"),  # a wildcard bind is reached through loopback
        ("::", "http://[::1]:8123"),
        ("llm.internal", "http://llm.internal:8123"),
    ],
)
def test_the_address_is_where_a_client_on_this_machine_reaches_the_service(tmp_path, host, url):
    assert launch.service_url(settings(tmp_path, host=host, port=8123)) == url


def test_the_base_models_card_is_served_not_an_adapter(tmp_path):
    served = launch.served_from(settings(tmp_path, port=8123, api_key=KEY), MODELS)
    assert served == launch.Served("http://127.0.0.1:8123", KEY, "Qwen3-0.6B", 40960)
    with pytest.raises(launch.LaunchError, match="lists no model"):
        launch.served_from(settings(tmp_path), {"data": [ADAPTER]})


def test_the_key_comes_from_the_key_file_too(tmp_path):
    (tmp_path / "key").write_text(KEY + "\n")
    assert launch.served_from(settings(tmp_path, api_key_file=tmp_path / "key"), MODELS).key == KEY


def test_claude_code_gets_the_service_the_key_and_the_model_as_both_of_its_models(tmp_path):
    environ = {"PATH": "/usr/bin", "ANTHROPIC_API_KEY": "sk-ant-real", "ANTHROPIC_MODEL": "claude-x"}
    launched = launch.prepare("claude", settings(tmp_path, port=8123, api_key=KEY), MODELS, environ)
    assert launched.env == {
        "PATH": "/usr/bin",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8123",
        "ANTHROPIC_AUTH_TOKEN": KEY,
        "ANTHROPIC_MODEL": "Qwen3-0.6B",
        "ANTHROPIC_SMALL_FAST_MODEL": "Qwen3-0.6B",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    assert launched.files == {}
    assert "ANTHROPIC_AUTH_TOKEN=k3y...123" in launched.said and not any(KEY in line for line in launched.said)


def test_without_a_key_the_clients_are_given_a_stand_in_for_their_login(tmp_path):
    launched = launch.prepare("claude", settings(tmp_path), MODELS, {})
    assert launched.env["ANTHROPIC_AUTH_TOKEN"] == launch.NO_KEY
    assert f"ANTHROPIC_AUTH_TOKEN={launch.NO_KEY}" in launched.said
    assert launch.prepare("codex", settings(tmp_path), MODELS, {}).env[launch.CODEX_KEY_VARIABLE] == launch.NO_KEY


def test_codex_gets_a_config_of_its_own_with_the_provider_the_model_and_its_context(tmp_path):
    s = settings(tmp_path, host="0.0.0.0", port=8123, api_key=KEY)
    launched = launch.prepare("codex", s, MODELS, {"PATH": "/usr/bin"})
    home = tmp_path / "cache" / "agent-clients" / "codex"
    assert launched.env == {"PATH": "/usr/bin", "CODEX_HOME": str(home), "SERVICE_API_KEY": KEY}
    [(path, text)] = launched.files.items()
    assert path == home / "config.toml"
    config = tomllib.loads(text)
    provider = config["model_providers"][config["model_provider"]]
    assert (config["model"], config["model_context_window"]) == ("Qwen3-0.6B", 40960)
    assert provider["base_url"] == "http://127.0.0.1:8123/v1" and provider["wire_api"] == "responses"
    assert provider["env_key"] == "SERVICE_API_KEY"
    assert "  model_context_window = 40960" in launched.said and not any(KEY in line for line in launched.said)
    # A card without a context says nothing of it, rather than a guess.
    no_length = launch.served_from(s, {"data": [{"id": "m", "parent": None}]})
    assert "model_context_window" not in tomllib.loads(launch.codex_config(no_length))


def test_the_client_is_the_one_named_else_on_path_else_the_checkouts(tmp_path, monkeypatch):
    on_path = tmp_path / "bin" / "claude"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    pinned = tmp_path / "pinned"
    pinned.mkdir()
    (pinned / "codex").write_text("#!/bin/sh\n")
    (pinned / "codex").chmod(0o755)
    monkeypatch.setattr(launch, "REPO_CLIENTS", pinned)
    assert launch.find_client("claude", None, path=str(on_path.parent)) == on_path
    assert launch.find_client("codex", None, path=str(on_path.parent)) == pinned / "codex"
    assert launch.find_client("codex", on_path, path="") == on_path
    with pytest.raises(launch.LaunchError, match="make agent-clients"):
        launch.find_client("claude", None, path=str(pinned))
    with pytest.raises(launch.LaunchError, match="not an executable"):
        launch.find_client("claude", tmp_path / "missing", path="")


@contextmanager
def models_server(status: int = 200) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A stand-in service answering GET /v1/models; the headers of each request seen."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(dict(self.headers))
            body = json.dumps(MODELS if status == 200 else {"error": {"message": "invalid key"}}).encode()
            self.send_response(status if self.path == "/v1/models" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_models_are_read_with_the_key_and_a_refusal_or_silence_names_the_address(tmp_path):
    with models_server() as (port, seen):
        assert launch.fetch_models(settings(tmp_path, port=port, api_key=KEY)) == MODELS
    assert seen[0]["Authorization"] == f"Bearer {KEY}"
    with models_server(401) as (port, _), pytest.raises(launch.LaunchError, match=r"answered 401: .*invalid key"):
        launch.fetch_models(settings(tmp_path, port=port, api_key=KEY))
    silent = free_port()
    with pytest.raises(launch.LaunchError, match=f"no service answers at http://127.0.0.1:{silent} "):
        launch.fetch_models(settings(tmp_path, port=silent), timeout=2)


STAND_IN = """#!{python}
import json, os, sys
print(json.dumps({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items() if k.startswith(("ANTHROPIC_", "CLAUDE_"))}}}}))
"""


def test_the_command_says_what_it_set_then_runs_the_client_with_its_arguments(tmp_path):
    client = tmp_path / "claude"
    client.write_text(STAND_IN.format(python=sys.executable))
    client.chmod(0o755)
    with models_server() as (port, _):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVICE_", "ANTHROPIC_"))}
        env |= {"SERVICE_PORT": str(port), "SERVICE_API_KEY": KEY, "ANTHROPIC_API_KEY": "sk-ant-real"}
        done = subprocess.run(
            [sys.executable, "-m", "service", "launch", "claude", "--client-path", str(client), "--", "-p", "hi"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    ran = json.loads(done.stdout)  # stdout is the client's alone
    assert ran["argv"] == ["-p", "hi"]
    assert ran["env"]["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}" and ran["env"]["ANTHROPIC_AUTH_TOKEN"] == KEY
    assert ran["env"]["ANTHROPIC_MODEL"] == "Qwen3-0.6B" and "ANTHROPIC_API_KEY" not in ran["env"]
    assert f"ANTHROPIC_BASE_URL=http://127.0.0.1:{port}" in done.stderr and KEY not in done.stderr
    assert f"running {client} -p hi" in done.stderr


def test_the_command_refuses_an_unknown_client_and_a_service_that_does_not_answer(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")} | {"SERVICE_PORT": str(free_port())}
    argv = [sys.executable, "-m", "service", "launch"]
    unknown = subprocess.run([*argv, "vim"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "one of claude, codex" in unknown.stderr
    client = tmp_path / "codex"
    client.write_text("#!/bin/sh\necho ran\n")
    client.chmod(0o755)
    silent = subprocess.run(
        [*argv, "codex", "--client-path", str(client)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert silent.returncode == 1 and f"no service answers at http://127.0.0.1:{env['SERVICE_PORT']}" in silent.stderr
    assert "ran" not in silent.stdout
