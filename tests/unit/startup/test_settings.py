"""Settings precedence (YAML < SERVICE_* env < CLI flags) and validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.facts.api_key import api_key_of
from service.settings import Settings, load_settings


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text("port: 9001\nbackend: avx512\nmax_model_len: 1024\n")
    return path


def test_yaml_then_env_then_flags(config, monkeypatch):
    assert load_settings(config).port == 9001
    monkeypatch.setenv("SERVICE_PORT", "9002")
    assert load_settings(config).port == 9002
    assert load_settings(config, port=9003).port == 9003


def test_flags_left_as_none_do_not_override(config, monkeypatch):
    monkeypatch.setenv("SERVICE_MAX_MODEL_LEN", "2048")
    assert load_settings(config, max_model_len=None).max_model_len == 2048


def test_config_file_from_environment(config, monkeypatch):
    monkeypatch.setenv("SERVICE_CONFIG", str(config))
    assert load_settings().backend == "avx512"


def test_shipped_defaults_load_and_bind_loopback(monkeypatch):
    for name in ("SERVICE_HOST", "SERVICE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    s = load_settings()
    assert s.host == "127.0.0.1" and s.port == 8000 and s.trust_remote_code is False
    assert s.explicitly_set() == frozenset()


@pytest.mark.parametrize(
    "env,value", [("SERVICE_BACKEND", "sparc"), ("SERVICE_PORT", "70000"), ("SERVICE_DTYPE", "int3")]
)
def test_invalid_values_are_rejected(config, monkeypatch, env, value):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError):
        load_settings(config)


def test_unknown_yaml_key_is_rejected(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("prot: 1\n")
    with pytest.raises(ValidationError):
        load_settings(path)


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("port: [1\n", "is not valid YAML: while parsing a flow sequence"),
        ("port:\t1\n", "is not valid YAML"),
        ("- port: 1\n", "must be a mapping of `setting: value` lines, not [{'port': 1}]"),
        ("8000\n", "lines, not 8000"),
    ],
)
def test_a_settings_file_that_is_not_a_mapping_is_named(tmp_path, text, says):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"settings file {path} ") as caught:
        load_settings(path)
    assert says in str(caught.value)


def test_an_empty_settings_file_is_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("SERVICE_PORT", raising=False)
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing set here\n")
    assert load_settings(path).port == Settings().port


def test_api_key_from_env_or_file(config, monkeypatch, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-file-0123456789\n")
    monkeypatch.setenv("SERVICE_API_KEY_FILE", str(key_file))
    assert api_key_of(load_settings(config)).value == "from-file-0123456789"
    monkeypatch.setenv("SERVICE_API_KEY", "from-env-0123456789")
    assert api_key_of(load_settings(config)).value == "from-env-0123456789"
    assert "from-env-0123456789" not in repr(load_settings(config))


def test_empty_env_means_unset(config, monkeypatch):
    monkeypatch.setenv("SERVICE_MODEL", "")
    monkeypatch.setenv("SERVICE_API_KEY", "")
    s = load_settings(config)
    assert s.model is None and api_key_of(s).value is None


def test_user_source_tracks_explicit_settings(config, monkeypatch):
    monkeypatch.setenv("SERVICE_ENABLE_PREFIX_CACHING", "true")
    assert {"enable_prefix_caching", "backend", "max_model_len", "port"} <= load_settings(config).explicitly_set()


def test_a_default_set_explicitly_is_the_users(config, monkeypatch):
    """Provenance comes from the source that set a field, not from comparing with the default."""
    monkeypatch.setenv("SERVICE_RESERVED_CPUS", "1")  # the built-in default
    s = load_settings(config, enforce_eager=False)  # the default too, as a flag
    assert {"reserved_cpus", "enforce_eager"} <= s.explicitly_set()
    assert s.source_of("reserved_cpus") == "env" and s.source_of("enforce_eager") == "flag"
    assert s.source_of("port") == "config file" and s.source_of("warmup") == "default"


def test_the_shipped_config_is_not_the_users(monkeypatch):
    for name in ("SERVICE_CONFIG", "SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    s = load_settings()
    assert s.source_of("port") == "shipped config" and "port" not in s.explicitly_set()


def test_direct_construction_counts_given_values_as_the_users(monkeypatch):
    monkeypatch.setenv("SERVICE_RESERVED_CPUS", "2")
    s = Settings(enforce_eager=False)
    assert s.source_of("enforce_eager") == "argument" and s.source_of("reserved_cpus") == "env"
    assert {"enforce_eager", "reserved_cpus"} <= s.explicitly_set() and "port" not in s.explicitly_set()
