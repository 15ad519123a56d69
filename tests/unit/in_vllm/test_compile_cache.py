"""Compile cache: where vLLM keeps it (a decision) and the vLLM 0.32 loader fix (version-gated, idempotent)."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from service.in_vllm import compile_cache_patch as patch
from service.in_vllm.contract import AOT_CACHE_PATCH_ENV
from service.policy.in_vllm.compile_cache import needs_patch, plan_compile_cache


def test_cache_root_is_decided_under_the_service_cache_dir():
    plan = plan_compile_cache(Path("/data/cache"), "0.32.0", {})
    assert plan.env == {"VLLM_CACHE_ROOT": "/data/cache/vllm", AOT_CACHE_PATCH_ENV: "1"}
    root, fix = plan.decisions
    assert (root.setting, root.source) == ("env.VLLM_CACHE_ROOT", "policy") and "cache volume" in root.reason
    assert (fix.setting, fix.value, fix.source) == (f"env.{AOT_CACHE_PATCH_ENV}", "1", "policy")
    assert "finalize_loading" in fix.reason and "carried to every vLLM process" in fix.reason


def test_user_cache_root_wins():
    plan = plan_compile_cache(Path("/data/cache"), "0.32.0", {"VLLM_CACHE_ROOT": "/elsewhere"})
    assert plan.env == {AOT_CACHE_PATCH_ENV: "1"}
    assert (plan.decisions[0].value, plan.decisions[0].source) == ("/elsewhere", "user")


@pytest.mark.parametrize(
    ("version", "needed"), [("0.32.0", True), ("0.32.1", True), ("0.31.2", False), ("0.33.0", False), (None, False)]
)
def test_patch_is_gated_to_vllm_0_32(version, needed):
    assert needs_patch(version) is needed
    assert plan_compile_cache(Path("/c"), version, {}).decisions[1].value == ("1" if needed else "0")


def test_patch_does_nothing_where_the_startup_did_not_decide_it(monkeypatch):
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Artifact

    before = vars(Artifact).get("finalize_loading")
    assert patch.apply_patch(False) == "not decided by the service's startup"
    monkeypatch.setenv(AOT_CACHE_PATCH_ENV, "0")
    patch.register()
    assert vars(Artifact).get("finalize_loading") is before


def test_patch_gives_torchs_inductor_artifact_the_method_vllms_loader_calls():
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Artifact

    def compiled(*args):
        return "ran"

    compiled.serialize = lambda: b""  # what torch requires of an AOTAutograd result
    artifact = Artifact(compiled)
    if not getattr(Artifact, patch._MARK, False):
        # The fault vLLM 0.32 hits on every warm start of the CPU platform's inductor artifact.
        with pytest.raises(AttributeError, match="'function' object has no attribute 'finalize_loading'"):
            artifact.finalize_loading(None)
    assert patch.apply_patch(True) in ("applied", "already applied")
    assert patch.apply_patch(True) == "already applied"
    assert artifact.finalize_loading(object()) is None
    assert artifact() == "ran"


def test_patch_is_registered_as_our_own_vllm_general_plugin():
    ours = [
        ep
        for ep in entry_points(group="vllm.general_plugins")
        if ep.value.startswith("service.in_vllm.compile_cache_patch")
    ]
    assert len(ours) == 1 and ours[0].load() is patch.register


def test_the_services_variables_key_the_compiled_graph():
    """vLLM hashes additional_config into its torch.compile cache key: plans that differ only in the kernels the
    service's plugin registers get different keys; the flag vLLM parses is JSON."""
    from service.policy.in_vllm.compile_cache import compile_key
    from service.server.supervision.engine_start import engine_flags

    plain = {"SERVICE_VLLM_PLATFORM": "vllm.platforms.cpu.CpuPlatform", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    kernel = {**plain, "SERVICE_LINEAR_KERNELS": "Bf16WeightsLinear"}
    keys = [compile_key(env).engine_args["additional_config"] for env in (plain, kernel)]
    assert keys[0] == {"service": {"SERVICE_VLLM_PLATFORM": "vllm.platforms.cpu.CpuPlatform"}}  # vLLM hashes its own
    assert keys[1]["service"]["SERVICE_LINEAR_KERNELS"] == "Bf16WeightsLinear"
    assert compile_key({"VLLM_CPU_OMP_THREADS_BIND": "0"}).decisions == ()
    flags = engine_flags({"additional_config": keys[1]})
    assert flags[0] == "--additional-config" and json.loads(flags[1]) == keys[1]
