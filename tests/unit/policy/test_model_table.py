"""The `models` table: its settings, the memory share each engine is planned in, and `detect --models` on a recorded
container (16 GiB cgroup limit) with the recorded model configs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from service.__main__ import app
from service.facts.hardware import read_hardware
from service.policy.engine.model_table import engine_counts, loaded_at_once, memory_share, table_errors
from service.settings import ListedModel, Settings, load_settings
from tests.unit.conftest import MODELS, SYSFS

GiB = 1024**3
CONTAINER = ("--cpuinfo", str(SYSFS / "container_cpuset/proc/cpuinfo"), "--sysfs", str(SYSFS / "container_cpuset/sys"))


def test_a_table_and_one_model_together_are_refused_and_names_are_given_once():
    with pytest.raises(ValidationError, match="not both"):
        Settings(model="x", models=[{"source": "y"}])
    with pytest.raises(ValidationError, match="the name\\(s\\) a are given to more than one model"):
        Settings(models=[{"source": "y", "name": "a"}, {"source": "z", "aliases": ["a"]}])
    with pytest.raises(ValidationError, match="extra"):
        Settings(models=[{"source": "y", "context": 4096}])  # a misspelt per-model setting is no silent default


def test_the_table_comes_from_the_variable_as_json(monkeypatch):
    monkeypatch.setenv("SERVICE_MODELS", json.dumps([{"source": "demo-tiny-llama", "pinned": True}]))
    monkeypatch.setenv("SERVICE_MAX_LOADED_MODELS", "1")
    settings = load_settings()
    assert settings.models == [ListedModel(source="demo-tiny-llama", pinned=True)]
    assert loaded_at_once(settings) == 1


def test_an_entrys_own_settings_win_for_its_engine_and_count_as_the_users():
    settings = Settings(
        max_model_len=8192, dtype="bfloat16", models=[{"source": "/m", "name": "a", "dtype": "float32"}]
    )
    own = settings.for_listed(settings.models[0])
    assert (own.model, own.served_model_name, own.dtype, own.max_model_len) == ("/m", "a", "float32", 8192)
    assert {"model", "served_model_name", "dtype"} <= own.explicitly_set() and own.models == []


def test_the_memory_free_at_start_is_split_evenly_between_the_engines_loaded_at_once():
    limits = read_hardware(*(SYSFS / "container_cpuset" / p for p in ("proc/cpuinfo", "sys"))).limits
    shared, decision = memory_share(dataclasses.replace(limits, memory_available_bytes=12 * GiB), 3)
    assert shared.memory_bytes == 4 * GiB and shared.memory_available_bytes is None
    assert "12.00 GiB" in decision.reason and "3 engines" in decision.reason and decision.value == 4 * GiB
    alone, decision = memory_share(limits, 1)
    assert alone == limits and decision.value == limits.memory_bytes
    assert loaded_at_once(Settings(models=[{"source": "a"}, {"source": "b"}], max_loaded_models=5)) == 2


def test_pinned_models_must_all_fit_at_once():
    entries = [ListedModel(source="a", pinned=True), ListedModel(source="b", pinned=True)]
    [error] = table_errors(entries, 1, [((), ()), ((), ())])
    assert "2 pinned models (a, b) but 1 engine(s) loaded at once" in error
    assert table_errors(entries, 2, [((), ()), ((), ())]) == ()


def _table(tmp_path, entries, **settings):
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump({"models": entries, **settings}))
    result = CliRunner().invoke(app, ["detect", "--json", "--config", str(config), *CONTAINER])
    return result.exit_code, json.loads(result.stdout)


def test_detect_models_plans_each_in_its_share_and_refuses_with_the_numbers(tmp_path):
    code, table = _table(
        tmp_path,
        [
            {"source": str(MODELS / "bge-small-en-v1.5"), "name": "embed", "pinned": True},
            {"source": str(MODELS / "qwen2.5-7b-instruct-gptq-int4"), "name": "coder", "max_model_len": 4096},
            {"source": str(MODELS / "llama-3.1-8b-instruct"), "name": "big", "max_model_len": 4096},
        ],
        max_loaded_models=2,
    )
    assert code == 1 and table["loaded_at_once"] == 2
    by_name = {m["name"]: m for m in table["models"]}
    share = {d["setting"]: d["value"] for d in by_name["embed"]["plan"]["decisions"]}["model.memory_share"]
    assert share == 8 * GiB and by_name["embed"]["plan"]["errors"] == [] and by_name["embed"]["pinned"]
    # the 7B GPTQ model fits the 16 GiB container alone, not half of it; the 8B bf16 one not even alone
    coder, big = table["errors"]
    assert coder.startswith("coder: fits this machine alone but not in 1/2 of it") and "limit is 8.00 GiB" in coder
    assert big.startswith("big: refused even with the machine to itself") and "limit is 16.00 GiB" in big
    assert by_name["coder"]["fits_alone"] and not by_name["big"]["fits_alone"]


def test_a_table_that_fits_exits_zero_and_each_engine_gets_its_own_names(tmp_path):
    code, table = _table(
        tmp_path,
        [
            {"source": str(MODELS / "bge-small-en-v1.5"), "name": "embed", "aliases": ["text-embedding-*"]},
            {"source": str(MODELS / "qwen2.5-7b-instruct-gptq-int4"), "name": "coder", "max_model_len": 4096},
        ],
        max_loaded_models=1,
    )
    assert code == 0 and table["errors"] == []
    plans = {m["name"]: {d["setting"]: d["value"] for d in m["plan"]["decisions"]} for m in table["models"]}
    assert plans["coder"]["engine.max_model_len"] == 4096 and plans["coder"]["model.memory_share"] == 16 * GiB


def test_without_max_loaded_models_the_table_tries_every_count_down_to_one_beside_the_pinned():
    listed = [{"source": "a", "pinned": True}, {"source": "b"}, {"source": "c"}]
    assert engine_counts(Settings(models=listed)) == (3, 2)
    assert engine_counts(Settings(models=listed, max_loaded_models=1)) == (1,)
    assert engine_counts(Settings(models=[{"source": "a"}, {"source": "b"}])) == (2, 1)
    assert engine_counts(Settings(models=[{"source": "a", "pinned": True}])) == (1,)


def test_pinned_models_that_take_every_engine_leave_the_others_unloadable():
    entries = [ListedModel(source="a", pinned=True), ListedModel(source="b")]
    [error] = table_errors(entries, 1, [((), ()), ((), ())])
    assert "1 pinned model(s) take all 1 engine(s) loaded at once: b could never load" in error


def test_the_table_loads_fewer_at_once_where_the_memory_holds_fewer(tmp_path):
    code, table = _table(
        tmp_path,
        [
            {"source": str(MODELS / "bge-small-en-v1.5"), "name": "embed"},
            {"source": str(MODELS / "qwen2.5-7b-instruct-gptq-int4"), "name": "coder", "max_model_len": 4096},
        ],
    )
    # the GPTQ model does not fit half of the 16 GiB container: one engine at once, the whole limit each
    assert code == 0 and table["errors"] == [] and table["loaded_at_once"] == 1
    assert "do not fit their shares together: 1 at once" in table["loaded_at_once_reason"]
