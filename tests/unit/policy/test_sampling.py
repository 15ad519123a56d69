"""What a request that names no temperature samples with (policy/engine/sampling.py): greedy for the packaged default model,
as its measurement says, the model's own generation config for any other, and off where the user says so."""

from __future__ import annotations

from service.policy.engine.sampling import GREEDY, MEASURED, plan_sampling


def _decision(result):
    (decision,) = result.decisions
    assert decision.setting == "engine.override_generation_config"
    return decision


def test_the_default_model_samples_greedily_where_a_request_names_no_temperature_and_says_why():
    decision = _decision(plan_sampling(True, "auto", False))
    assert decision.value == GREEDY and decision.source == "policy"
    assert MEASURED in decision.reason and "agents name none" in decision.reason


def test_a_model_of_the_users_own_keeps_its_generation_config():
    decision = _decision(plan_sampling(False, "auto", False))
    assert decision.value is None and decision.source == "default"


def test_off_keeps_vllms_default_for_the_default_model_too():
    decision = _decision(plan_sampling(True, "off", True))
    assert decision.value is None and decision.source == "user"
