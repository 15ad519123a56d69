"""The contract with vLLM's processes (service/in_vllm/contract.py): every variable the service hands over is listed
once, with a reader that exists, and the policy cannot hand over one that is not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.in_vllm import contract
from service.policy.in_vllm.compile_cache import OUTSIDE_THE_GRAPH
from service.policy.plan.decision import env
from service.settings import Settings
from service.startup import build_report
from tests.unit.conftest import CPUINFO

ROOT = Path(__file__).resolve().parents[3]


def test_each_variable_is_listed_once_with_a_reader_that_exists():
    names = [v.name for v in contract.VARIABLES]
    assert len(names) == len(set(names))
    for v in contract.VARIABLES:
        path = v.reader.split(" ")[0]
        if path.startswith("service/"):
            assert (ROOT / path).is_file(), v
        for writer in v.writer.split(", "):
            assert list((ROOT / "service/policy").rglob(f"{writer}.py")), v


def test_the_policy_cannot_hand_over_a_variable_the_contract_does_not_list():
    with pytest.raises(ValueError, match="SERVICE_SOMETHING_NEW is handed to vLLM's processes but not listed"):
        env("SERVICE_SOMETHING_NEW", "1", "why", "policy")


@pytest.mark.parametrize("cpuinfo", sorted(CPUINFO.glob("*.txt")), ids=lambda p: p.stem)
def test_every_variable_a_plan_hands_over_is_in_the_contract(cpuinfo):
    report = build_report(Settings(), model=None, cpuinfo=cpuinfo, environ={"VLLM_TARGET_DEVICE": "cpu"}).to_dict()
    assert set(report["env"]) <= set(contract.BY_NAME)
    service = report["engine_args"].get("additional_config", {}).get(contract.ADDITIONAL_CONFIG_KEY, {})
    assert service == {
        k: v for k, v in report["env"].items() if k.startswith("SERVICE_") and k not in OUTSIDE_THE_GRAPH
    }


def test_the_service_names_its_variables_in_the_contract_alone():
    """No module that writes or reads a handed-over variable spells its name: they import it from the contract."""
    spelled = re.compile(r"\"(SERVICE_(?:VLLM|TORCH|AMX|LORA|REJECTION|TOP|LINEAR|GGML)_[A-Z_]+)\"")
    found = {
        (path.relative_to(ROOT).as_posix(), name)
        for folder in ("service/in_vllm", "service/kernels", "service/policy", "service/startup")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "contract.py"
        for name in spelled.findall(path.read_text())
        if name in contract.BY_NAME
    }
    assert found == set()
