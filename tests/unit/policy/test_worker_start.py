"""How vLLM starts its engine core and workers (service/policy/in_vllm/worker_start.py)."""

from __future__ import annotations

from service.in_vllm.contract import ADDITIONAL_CONFIG_KEY, WORKER_START_ENV
from service.policy.in_vllm.worker_start import MEASURED, plan_worker_start
from service.settings import Settings
from service.startup import build_report
from tests.unit.conftest import CPUINFO


def test_the_engine_core_and_workers_are_forked_citing_the_measurement():
    (decision,) = plan_worker_start("auto", False).decisions
    assert (decision.name, decision.value, decision.source) == (WORKER_START_ENV, "fork", "policy")
    assert MEASURED in decision.reason and "the engine core from the API process" in decision.reason


def test_the_user_may_keep_vllms_spawn():
    (decision,) = plan_worker_start("spawn", True).decisions
    assert (decision.value, decision.source) == ("spawn", "user")


def test_the_start_method_stays_out_of_the_compile_cache_key():
    """A worker compiles the same graph however it was started: both start methods share the cache."""
    configs = []
    for start in ("auto", "spawn"):
        report = build_report(
            Settings(worker_start=start), model=None, cpuinfo=CPUINFO / "epyc_9755_zen5.txt", environ={}
        )
        assert report.to_dict()["env"][WORKER_START_ENV] == ("fork" if start == "auto" else "spawn")
        configs.append(report.plan.find("engine.additional_config").value[ADDITIONAL_CONFIG_KEY])
    assert configs[0] == configs[1] and WORKER_START_ENV not in configs[0]
