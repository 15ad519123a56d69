"""Backend choice for every recorded CPU, explicit requests, and refusals."""

from __future__ import annotations

import pytest

from service.facts.cpu import parse_cpuinfo
from service.facts.hardware import read_hardware
from service.in_vllm.contract import PLATFORM_ENV
from service.policy.machine.backend import choose_backend
from service.policy.machine.backends import GENERIC_PLATFORM, ZEN_PLATFORM
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import Settings
from tests.unit.conftest import CPUINFO, software

EXPECTED_AUTO = {
    "epyc_7763_zen3.txt": ("avx2", "avx2"),
    "epyc_9654_zen4.txt": ("zen", "avx512"),
    "epyc_9755_zen5.txt": ("zen", "avx512"),
    "xeon_8280_cascadelake.txt": ("avx512", "avx512"),
    "xeon_8380_icelake.txt": ("avx512", "avx512"),
    "xeon_8480_sapphirerapids.txt": ("amx", "amx"),
    "xeon_8592_emeraldrapids.txt": ("amx", "amx"),
    "xeon_6980p_graniterapids.txt": ("amx", "amx"),
    "core_i7_12700k_alderlake.txt": ("avx2", "avx2"),
    "build_machine.txt": ("amx", "amx"),
}


def cpu(name: str):
    return read_hardware(cpuinfo_path=CPUINFO / name).cpu


@pytest.mark.parametrize("name", sorted(EXPECTED_AUTO))
def test_auto_backend_with_and_without_zentorch(name):
    with_zt, without_zt = EXPECTED_AUTO[name]
    chosen = choose_backend(cpu(name), software(True))
    assert (chosen.name, chosen.error) == (with_zt, None)
    assert choose_backend(cpu(name), software(False)).name == without_zt


def test_zen_reason_names_the_hardware_and_zentorch():
    reason = choose_backend(cpu("epyc_9654_zen4.txt"), software(True)).reason
    assert "zen4" in reason and "zentorch" in reason


def test_amd_without_zentorch_says_why_zen_was_not_chosen():
    reason = choose_backend(cpu("epyc_9654_zen4.txt"), software(False)).reason
    assert reason.startswith("zen4 has AVX-512 (") and "not zen" in reason and "not installed" in reason


def test_avx512f_alone_gets_the_avx2_backend_and_says_why():
    text = (CPUINFO / "xeon_8380_icelake.txt").read_text().replace(" avx512bw", "").replace(" avx512vl", "")
    chosen = choose_backend(parse_cpuinfo(text), software(True))
    assert chosen.name == "avx2"
    assert "AVX-512F alone" in chosen.reason and "BW, DQ and VL" in chosen.reason


def test_amx_without_avx512_bf16_gets_the_avx512_backend_and_says_why():
    text = (CPUINFO / "xeon_8480_sapphirerapids.txt").read_text().replace(" avx512_bf16", "")
    chosen = choose_backend(parse_cpuinfo(text), software(True))
    assert chosen.name == "avx512"
    assert "not amx" in chosen.reason and "AMX without AVX-512 BF16" in chosen.reason, chosen.reason


def test_intel_auto_reason_says_zen_is_unavailable_and_why():
    reason = choose_backend(cpu("xeon_8380_icelake.txt"), software(True)).reason
    assert "not zen" in reason and "GenuineIntel" in reason


@pytest.mark.parametrize("name", ["graviton3_neoverse_v1.txt", "ampere_altra_neoverse_n1.txt"])
def test_arm_is_refused_with_reason(name):
    chosen = choose_backend(cpu(name), software(True))
    assert chosen.name is None and "aarch64" in chosen.error


def test_x86_without_avx2_is_refused():
    import dataclasses

    old = cpu("xeon_8380_icelake.txt")
    no_avx = dataclasses.replace(old, isa=type(old.isa)())
    chosen = choose_backend(no_avx, software(True))
    assert chosen.name is None and "AVX2" in chosen.error and "SIGILL" in chosen.error


def test_requested_zen_on_intel_is_an_error_naming_the_vendor():
    chosen = choose_backend(cpu("xeon_8480_sapphirerapids.txt"), software(True), "zen")
    assert chosen.name is None and "zen" in chosen.error and "GenuineIntel" in chosen.error


def test_requested_zen_without_zentorch_is_an_error():
    chosen = choose_backend(cpu("epyc_9654_zen4.txt"), software(False), "zen")
    assert chosen.name is None and "not installed" in chosen.error


def test_requested_amx_on_cascadelake_is_an_error():
    chosen = choose_backend(cpu("xeon_8280_cascadelake.txt"), software(True), "amx")
    assert chosen.name is None and "AMX" in chosen.error


@pytest.mark.parametrize("requested", ["avx2", "avx512"])
def test_requesting_a_lower_kernel_build_than_vllm_would_run_is_an_error_not_a_silent_change(requested):
    chosen = choose_backend(cpu("xeon_8480_sapphirerapids.txt"), software(True), requested)
    assert chosen.name is None and "would run 'amx'" in chosen.error and "kernel build" in chosen.error


@pytest.mark.parametrize("name", ["epyc_9654_zen4.txt", "epyc_9755_zen5.txt"])
def test_avx512_on_a_zen_host_with_zentorch_is_the_generic_platform_escape_hatch(name):
    chosen = choose_backend(cpu(name), software(True), "avx512")
    assert (chosen.name, chosen.error, chosen.platform) == ("avx512", None, GENERIC_PLATFORM)
    assert "escape hatch" in chosen.reason and "A/B" in chosen.reason and "zentorch off" in chosen.reason


def test_avx2_on_a_zen_host_stays_refused_naming_the_lowering_that_exists():
    chosen = choose_backend(cpu("epyc_9755_zen5.txt"), software(True), "avx2")
    assert chosen.name is None and "would run 'zen'" in chosen.error
    assert "kernel build from the CPU" in chosen.error and "'avx512'" in chosen.error


@pytest.mark.parametrize("name", sorted(EXPECTED_AUTO))
def test_platform_follows_the_backend(name):
    for zentorch in (True, False):
        chosen = choose_backend(cpu(name), software(zentorch))
        assert chosen.platform == (ZEN_PLATFORM if chosen.name == "zen" else GENERIC_PLATFORM)


@pytest.mark.parametrize(
    ("requested", "platform", "source"), [("auto", ZEN_PLATFORM, "policy"), ("avx512", GENERIC_PLATFORM, "user")]
)
def test_zen_fixture_plan_carries_the_platform_to_vllm_processes(requested, platform, source):
    """The path `detect --cpuinfo` takes: the plan's environment names the class the plugin will return."""
    hardware = read_hardware(cpuinfo_path=CPUINFO / "epyc_9755_zen5.txt")
    plan = plan_engine(
        PlanInputs(hardware, None, software(True), Settings(backend=requested), {"VLLM_TARGET_DEVICE": "cpu"})
    )
    assert not plan.errors and plan.backend.platform == platform and plan.env[PLATFORM_ENV] == platform
    decision = next(d for d in plan.decisions if d.setting == f"env.{PLATFORM_ENV}")
    assert (decision.value, decision.source) == (platform, source)
    # vLLM asks platform plugins only when VLLM_TARGET_DEVICE is not "cpu".
    assert plan.env["VLLM_TARGET_DEVICE"] == ""


@pytest.mark.parametrize(
    "name,requested",
    [("xeon_8480_sapphirerapids.txt", "amx"), ("epyc_9654_zen4.txt", "zen"), ("epyc_7763_zen3.txt", "avx2")],
)
def test_requested_backend_that_matches_is_accepted(name, requested):
    chosen = choose_backend(cpu(name), software(True), requested)
    assert chosen.name == requested and chosen.error is None and chosen.reason.startswith("requested")
