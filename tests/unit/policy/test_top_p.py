"""Which top-p masking every vLLM process runs (service/policy/engine/top_p.py)."""

from __future__ import annotations

from service.in_vllm.contract import TOP_P_ENV
from service.policy.engine.top_p import MEASURED, plan_top_p


def test_on_the_vllm_it_was_written_for_the_service_masks_from_the_top_tokens_citing_the_measurement():
    (decision,) = plan_top_p("auto", False, "0.32.0").decisions
    assert (decision.name, decision.value, decision.source) == (TOP_P_ENV, "partial", "policy")
    assert MEASURED in decision.reason and "the same tokens kept" in decision.reason


def test_another_vllm_keeps_its_own_and_says_why_and_refuses_where_the_user_asked_for_the_services():
    (decision,) = plan_top_p("auto", False, "0.33.1").decisions
    assert decision.value == "sort" and "0.33.1" in decision.reason
    (error,) = plan_top_p("partial", True, "0.33.1").errors
    assert "top_p_mask=partial" in error and "0.33.1" in error


def test_the_user_may_keep_vllms_sort():
    (decision,) = plan_top_p("sort", True, "0.32.0").decisions
    assert (decision.value, decision.source) == ("sort", "user")
