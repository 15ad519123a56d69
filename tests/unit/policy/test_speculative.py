"""The speculative setting: what each value hands vLLM, and what `auto` rests on (service/policy/speculative.py)."""

from __future__ import annotations

import pytest

from service.measurements.store import store
from service.policy.speculative import EAGLE_TOKENS, NGRAM, measured_key, plan_speculative
from service.settings import Settings, load_settings
from tests.unit.policy.test_policy_engine import decision, plan

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


def test_any_other_value_is_a_draft_model_handed_to_vllm():
    planned = config(plan_speculative("/models/draft", True, "zen", None))
    assert planned["method"] == "draft_model" and planned["model"] == "/models/draft"
    assert planned["num_speculative_tokens"] > 0


def test_eagle_hands_vllm_the_heads_directory_and_refuses_none():
    planned = plan_speculative("eagle:/models/head", True, "amx", None, "0.32.0")
    assert config(planned) == {"method": "eagle", "model": "/models/head", "num_speculative_tokens": EAGLE_TOKENS}
    assert planned.env["SERVICE_REJECTION_SAMPLER"] == "torch"
    refused = plan_speculative("eagle:", True, "amx", None)
    assert not refused.ok and "eagle:<" in refused.errors[0]


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
