"""The plan's stages as a registry (service/policy/plan/plan.py STAGES): every stage runs on every recorded CPU, with and
without a model, and what it decides is a decision the report can show: named once, with its reason and who chose
it; a variable it hands to vLLM's processes is one the contract lists (decision.env refuses others)."""

from __future__ import annotations

from collections import Counter

import pytest

from service.facts.model import inspect_model
from service.policy.plan.plan import STAGES, plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import load_settings
from tests.unit.conftest import CPUINFO, FIXTURES, software
from tests.unit.policy.test_policy_engine import hw

MODELS = (None, "llama-3.1-8b-instruct", "qwen2.5-7b-instruct-gptq-int4")


def test_stages_are_named_once():
    assert len({s.name for s in STAGES}) == len(STAGES) and STAGES[0].name == "backend"


@pytest.mark.parametrize("cpu", sorted(p.name for p in CPUINFO.glob("*.txt")))
@pytest.mark.parametrize("model", MODELS)
def test_every_stage_decides_with_a_reason_on_every_recorded_cpu(cpu, model):
    facts = inspect_model(str(FIXTURES / "models" / model)) if model else None
    plan = plan_engine(PlanInputs(hw(cpu), facts, software(True), load_settings(), {}))
    settings = Counter(d.setting for d in plan.decisions)
    assert [s for s, n in settings.items() if n > 1] == []
    for d in plan.decisions:
        assert d.reason and d.source in ("default", "policy", "calibration", "user"), d
