"""The platform decision, its trip through the environment (startup.apply), and the plugin's answer.

vLLM itself resolving the platform with the plugin, and the per-process state lines, are integration tests
(tests/integration/test_platform.py): they need vLLM imported or an engine running.
"""

from __future__ import annotations

import json

import pytest

from service.facts.hardware import read_hardware
from service.in_vllm import plugin as vllm_plugin
from service.in_vllm.contract import AMX_STATE_ENV, FXGRAPH_PATCH_ENV, KERNELS_ENV, PLATFORM_ENV, PLATFORM_IMPORTS_ENV
from service.policy.machine.backend import choose_backend
from service.policy.machine.backends import GENERIC_PLATFORM, ZEN_PLATFORM
from service.policy.machine.platform import PLUGIN_NAME, choose_platform
from service.settings import Settings
from service.startup import apply, build_report
from tests.unit.conftest import CPUINFO, software


def backend(name: str = "epyc_9755_zen5.txt", requested: str = "auto"):
    return choose_backend(read_hardware(cpuinfo_path=CPUINFO / name).cpu, software(True), requested)


def test_target_device_cpu_is_emptied_so_that_vllm_asks_the_plugin():
    choice = choose_platform(backend(), {"VLLM_TARGET_DEVICE": "CPU"})
    assert choice.env == {PLATFORM_ENV: ZEN_PLATFORM, PLATFORM_IMPORTS_ENV: "zentorch", "VLLM_TARGET_DEVICE": ""}
    assert "never asks platform plugins" in choice.decisions[2].reason


def test_nothing_to_undo_without_target_device():
    choice = choose_platform(backend("xeon_8380_icelake.txt"), {})
    assert choice.env == {PLATFORM_ENV: GENERIC_PLATFORM} and len(choice.decisions) == 1
    assert choice.decisions[0].source == "policy" and "CpuPlatform" in choice.decisions[0].reason


def test_a_plugin_allowlist_without_ours_is_a_warning():
    assert choose_platform(backend(), {"VLLM_PLUGINS": f"other,{PLUGIN_NAME}"}).warnings == ()
    (warning,) = choose_platform(backend(), {"VLLM_PLUGINS": "other"}).warnings
    assert PLUGIN_NAME in warning and "ZenCpuPlatform" in warning


@pytest.mark.parametrize("requested", ["auto", "avx512"])
def test_apply_puts_both_decisions_in_the_environment(requested):
    """`serve` on the recorded Zen 5 host: what every vLLM process will inherit."""
    environ = {"VLLM_TARGET_DEVICE": "cpu"}
    report = build_report(
        Settings(backend=requested), model=None, cpuinfo=CPUINFO / "epyc_9755_zen5.txt", environ=environ
    )
    apply(report, environ)
    patch = report.plan.find(f"env.{FXGRAPH_PATCH_ENV}")
    assert environ[PLATFORM_ENV] == report.plan.backend.platform == report.to_dict()["backend"]["platform"]
    assert environ[FXGRAPH_PATCH_ENV] == patch.value and report.to_dict()["env"][FXGRAPH_PATCH_ENV] == patch.value
    assert environ["VLLM_TARGET_DEVICE"] == ""


def test_the_plugin_returns_the_decision_or_leaves_vllm_alone(monkeypatch):
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    assert vllm_plugin.platform() is None
    monkeypatch.setenv(PLATFORM_ENV, GENERIC_PLATFORM)
    assert vllm_plugin.platform() == GENERIC_PLATFORM


def test_the_plugin_imports_what_the_decision_names_and_refuses_a_platform_whose_ops_do_not_import(monkeypatch, caplog):
    """The Zen platform's ops are registered by importing zentorch: the startup names the modules, the plugin
    imports them; one that does not import leaves vLLM to decide, with an error naming it."""
    report = build_report(Settings(), model=None, cpuinfo=CPUINFO / "epyc_9755_zen5.txt", environ={})
    assert report.to_dict()["env"][PLATFORM_IMPORTS_ENV] == "zentorch"
    monkeypatch.setenv(PLATFORM_ENV, ZEN_PLATFORM)
    monkeypatch.setenv(PLATFORM_IMPORTS_ENV, "json")
    assert vllm_plugin.platform() == ZEN_PLATFORM
    monkeypatch.setenv(PLATFORM_IMPORTS_ENV, "no_such_module_of_ops")
    assert vllm_plugin.platform() is None
    assert "no_such_module_of_ops does not import" in caplog.text


def test_every_process_does_nothing_without_the_service(monkeypatch, capfd):
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    monkeypatch.delenv(FXGRAPH_PATCH_ENV, raising=False)
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    monkeypatch.delenv(AMX_STATE_ENV, raising=False)
    vllm_plugin.every_process()
    assert capfd.readouterr().err == ""


def test_every_process_registers_the_decided_kernels_and_names_any_it_cannot(monkeypatch, caplog):
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    monkeypatch.delenv(FXGRAPH_PATCH_ENV, raising=False)
    monkeypatch.setenv(KERNELS_ENV, "NoSuchKernel")
    vllm_plugin.every_process()
    (record,) = [r for r in caplog.records if r.getMessage().startswith(vllm_plugin.STATE_PREFIX)]
    state = json.loads(record.getMessage().removeprefix(vllm_plugin.STATE_PREFIX))
    assert record.levelname == "ERROR" and state["linear_kernels"]["NoSuchKernel"].startswith(
        "not a kernel of the service"
    )
    assert "ArkWNA16LinearKernel" in state["linear_kernels"]["NoSuchKernel"]
