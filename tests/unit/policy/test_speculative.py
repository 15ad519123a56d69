"""The speculative setting: what each value hands vLLM, and what `auto` rests on (service/policy/engine/speculative.py); a
draft model's or EAGLE head's directory as service/facts/draft_model.py reads it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from service.facts.draft_model import read_draft
from service.measurements.store import store
from service.policy.engine.speculative import EAGLE_TOKENS, NGRAM, measured_key, plan_speculative
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import Settings, load_settings
from service.startup import build_report
from service.startup.model_sources import ModelChoice
from tests.unit.conftest import MODELS, software
from tests.unit.policy.test_policy_engine import decision, hw, model, plan

BACKENDS = ("zen", "amx", "avx512", "avx2")


def config(result):
    return result.engine_args.get("speculative_config")


def test_off_and_ngram_are_what_the_user_set():
    off = plan_speculative("off", True, "zen", None)
    assert config(off) is None and off.decisions[0].source == "user" and "off" in off.decisions[0].reason
    ngram = plan_speculative("ngram", True, "avx2", None)
    assert config(ngram) == NGRAM and ngram.decisions[0].source == "user"


def test_suffix_needs_arctic_inference_and_says_so():
    refused = plan_speculative("suffix", True, "zen", None)
    assert not refused.ok and "arctic-inference" in refused.errors[0] and "ngram" in refused.errors[0]
    assert config(plan_speculative("suffix", True, "zen", "0.1.1")) == {"method": "suffix"}


def draft_dir(path: Path, config: dict | None = None, weights: tuple[str, ...] = ("model.safetensors",)) -> Path:
    """A draft model's directory: config.json and weight files (safetensors written as such, others as bytes)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or {"architectures": ["LlamaForCausalLM"]}))
    for name in weights:
        if name.endswith(".safetensors"):
            save_file({"w": np.zeros(4, dtype=np.float32)}, str(path / name))
        else:
            (path / name).write_bytes(b"a pickle")
    return path


def draft_plan(setting: str, directory: str, trust_remote_code: bool = False, vllm: str | None = None):
    return plan_speculative(setting, True, "zen", None, vllm, read_draft(directory), trust_remote_code)


def test_a_draft_models_local_directory_is_handed_to_vllm_by_its_absolute_path(tmp_path, monkeypatch):
    draft_dir(tmp_path / "draft")
    monkeypatch.chdir(tmp_path)
    planned = config(draft_plan("draft", "draft"))
    assert planned["method"] == "draft_model" and planned["model"] == str(tmp_path / "draft")
    assert planned["num_speculative_tokens"] > 0


def test_eagle_hands_vllm_the_heads_directory_and_refuses_none(tmp_path):
    head = draft_dir(tmp_path / "head")
    planned = draft_plan(f"eagle:{head}", str(head), vllm="0.32.0")
    assert config(planned) == {"method": "eagle", "model": str(head), "num_speculative_tokens": EAGLE_TOKENS}
    assert planned.env["SERVICE_REJECTION_SAMPLER"] == "torch"
    refused = plan_speculative("eagle:", True, "amx", None)
    assert not refused.ok and "eagle:<" in refused.errors[0]


@pytest.mark.parametrize("setting", ["acme/draft", "eagle:acme/head", "/models/missing"])
def test_a_draft_that_is_not_a_local_directory_is_never_handed_to_vllm_to_download(setting, tmp_path, monkeypatch):
    """vLLM would fetch a hub id itself: no pre-flight, no disk check, pickled weights allowed."""
    monkeypatch.chdir(tmp_path)
    refused = draft_plan(setting, setting.removeprefix("eagle:"))
    assert config(refused) is None and not refused.decisions
    (error,) = refused.errors
    assert "must be a local directory" in error and "python -m service pull" in error


def test_a_draft_with_only_pickled_weights_or_no_config_is_refused(tmp_path):
    pickled = draft_dir(tmp_path / "pickled", weights=("pytorch_model.bin",))
    (error,) = draft_plan(str(pickled), str(pickled)).errors
    assert "no safetensors weights" in error and "pytorch_model.bin" in error
    bare = draft_dir(tmp_path / "bare")
    (bare / "config.json").unlink()
    (error,) = draft_plan(f"eagle:{bare}", str(bare)).errors
    assert "has no config.json" in error and "an EAGLE head" in error
    both = draft_dir(tmp_path / "both", weights=("model.safetensors", "pytorch_model.bin"))
    assert draft_plan(str(both), str(both)).ok  # vLLM loads the safetensors where both are


def test_a_truncated_draft_shard_is_refused_naming_it(tmp_path):
    truncated = draft_dir(tmp_path / "draft")
    shard = truncated / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8])
    (error,) = draft_plan(str(truncated), str(truncated)).errors
    assert "model.safetensors is truncated" in error


def test_a_drafts_own_code_is_refused_while_trust_remote_code_is_on(tmp_path):
    """vLLM builds the draft's config with the served model's trust_remote_code: that consent is not the draft's."""
    coded = draft_dir(tmp_path / "coded", {"auto_map": {"AutoConfig": "configuration_x.XConfig"}})
    (error,) = draft_plan(str(coded), str(coded), trust_remote_code=True).errors
    assert "configuration_x.XConfig" in error and "trust_remote_code" in error
    assert config(draft_plan(str(coded), str(coded), trust_remote_code=False))["model"] == str(coded)


def test_the_plan_and_the_startup_report_read_the_draft_directory(tmp_path):
    coded = draft_dir(tmp_path / "coded", {"auto_map": {"AutoModel": "modeling_x.X"}})
    settings = Settings(speculative=str(coded), trust_remote_code=True)
    inputs = PlanInputs(
        hw(), model("llama-3.1-8b-instruct"), software(), settings, {}, draft_model=read_draft(str(coded))
    )
    assert any("modeling_x.X" in e for e in plan_engine(inputs).errors)
    missing = Settings(speculative=str(tmp_path / "missing"), cache_dir=tmp_path / "cache")
    report = build_report(missing, model=ModelChoice("configured", str(MODELS / "llama-3.1-8b-instruct")))
    assert any("must be a local directory" in e and str(tmp_path / "missing") in e for e in report.errors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_follows_the_measurement_of_the_cpu_class_or_stays_off(backend):
    decided = plan_speculative("auto", False, backend, None)
    (d,) = decided.decisions
    key = measured_key(backend)
    if key in store().rows:
        on = store().rows[key].params["free_generation"][0] >= 1.0
        assert (config(decided) == NGRAM) is on and key in d.reason
    else:
        assert config(decided) is None and "not measured" in d.reason and backend in d.reason
    assert d.source == "policy"


def test_the_plan_hands_the_decision_to_vllm_for_generation_only():
    ngram = plan(speculative="ngram")
    assert ngram.engine_args["speculative_config"] == NGRAM
    assert decision(ngram, "engine.speculative_config").source == "user"
    assert "speculative_config" not in plan(speculative="off").engine_args
    assert not [d for d in plan(model_name="bge-small-en-v1.5").decisions if d.name == "speculative_config"]


def test_the_setting_comes_from_the_environment_and_refuses_an_empty_value(monkeypatch):
    monkeypatch.setenv("SERVICE_SPECULATIVE", "ngram")
    assert load_settings(None).speculative == "ngram"
    with pytest.raises(ValueError):
        Settings(speculative=" ")
