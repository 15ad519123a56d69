"""The model table's pure parts: which listed model a name means, which engine makes room, and what a child engine
is started with."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from service.__main__ import app
from service.server.router.child_config import child_env, child_settings, write_config
from service.server.router.eviction import Running, room_for_load
from service.server.router.names import listed_name
from service.settings import ListedModel, Settings, load_settings


def test_a_name_before_any_pattern_and_patterns_in_table_order():
    aliases = {"big": ["claude-*"], "small": ["claude-haiku-*", "gpt-*"], "claude-x": []}
    assert listed_name("small", aliases) == "small"
    assert listed_name("claude-x", aliases) == "claude-x"  # its own name, though big's pattern matches it
    assert listed_name("claude-haiku-4", aliases) == "big"  # the first listed pattern wins
    assert listed_name("gpt-4o", aliases) == "small"
    assert listed_name("llama", aliases) is None


def _running(name, state="loaded", pinned=False, in_flight=0, last_used=0.0):
    return Running(name, state, pinned, in_flight, last_used)


def test_room_while_under_the_engine_count():
    room = room_for_load([_running("a")], engines=2)
    assert room.load and room.stop is None


def test_the_least_recently_used_idle_unpinned_engine_stops():
    running = [_running("old", last_used=1), _running("older", last_used=0.5), _running("new", last_used=3)]
    room = room_for_load(running, engines=3)
    assert (room.load, room.stop) == (False, "older")
    assert "least recently used" in room.why


def test_pinned_busy_loading_and_stopping_engines_are_never_chosen():
    running = [
        _running("pinned", pinned=True, last_used=0),
        _running("busy", in_flight=1, last_used=0),
        _running("loading", state="loading", last_used=0),
        _running("idle", last_used=9),
    ]
    assert room_for_load(running, engines=4).stop == "idle"
    room = room_for_load(running[:3], engines=3)
    assert (room.load, room.stop) == (False, None)
    assert "pinned (pinned)" in room.why and "busy (1 in flight)" in room.why and "loading (loading)" in room.why


def test_a_stopping_engine_is_waited_for():
    room = room_for_load([_running("a", in_flight=1), _running("b", state="stopping")], engines=2)
    assert (room.load, room.stop, room.why) == (False, None, "an engine is stopping")


def test_the_child_gets_the_users_settings_the_entry_over_them_and_its_kv_share(tmp_path: Path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("SERVICE_"):
            monkeypatch.delenv(name)
    entry = ListedModel(source="demo-tiny-llama", name="demo", aliases=["d-*"], max_model_len=512)
    settings = Settings(
        models=[entry], api_key="secret", port=9000, host="0.0.0.0", enforce_eager=True, max_model_len=4096
    )
    values = child_settings(settings.for_listed(entry), "demo", 3 * 2**30, port=4321)
    assert values["model"] == "demo-tiny-llama"
    assert values["served_model_name"] == "demo"
    assert values["model_aliases"] == ["d-*"]
    assert values["max_model_len"] == 512  # the entry's, over the service-wide one
    assert values["enforce_eager"] is True
    assert values["kv_cache_gib"] == 3.0
    assert (values["host"], values["port"]) == ("127.0.0.1", 4321)  # loopback, whatever the front end binds
    assert not {"api_key", "api_key_file", "models", "max_loaded_models"} & values.keys()
    path = write_config(tmp_path / "table", "demo", values)
    assert yaml.safe_load(path.read_text()) == values
    assert path.stat().st_mode & 0o077 == 0
    env = child_env({"SERVICE_MODEL": "x", "PATH": "/bin"}, path, "k")
    assert env == {"PATH": "/bin", "SERVICE_CONFIG": str(path), "SERVICE_API_KEY": "k"}


def test_an_entrys_own_kv_cache_is_kept():
    entry = ListedModel(source="demo-tiny-llama", kv_cache_gib=1.5)
    settings = Settings(models=[entry])
    assert child_settings(settings.for_listed(entry), "demo", 3 * 2**30, port=1)["kv_cache_gib"] == 1.5


def test_the_example_table_sends_claude_codes_two_models_to_two_engines(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SERVICE_"):
            monkeypatch.delenv(name)
    example = Path(__file__).resolve().parents[3] / "configs" / "models.example.yaml"
    settings = load_settings(example)
    aliases = {entry.name: entry.aliases for entry in settings.models}
    assert listed_name("claude-haiku-4-5-20251001", aliases) == "smollm2"  # the small fast model
    assert listed_name("claude-sonnet-4-5-20250929", aliases) == "chat"  # the main one
    assert listed_name("text-embedding-3-small", aliases) is None
    assert settings.for_listed(settings.models[0]).model is None  # `default`: the default model


def test_a_pinned_model_with_an_idle_unload_is_refused():
    with pytest.raises(ValidationError, match="pinned model is never stopped"):
        ListedModel(source="demo-tiny-llama", pinned=True, idle_unload=60)


def test_a_table_off_loopback_without_a_key_stays_closed(tmp_path, monkeypatch, caplog):
    for name in list(os.environ):
        if name.startswith("SERVICE_"):
            monkeypatch.delenv(name)
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump({"host": "0.0.0.0", "models": [{"source": "demo-tiny-llama"}]}))
    result = CliRunner().invoke(app, ["serve", "--config", str(config)])
    assert result.exit_code == 2
    assert "API key" in caplog.text or "api_key" in caplog.text, caplog.text
