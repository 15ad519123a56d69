"""Where vLLM keeps its torch.compile cache, what keys it, and whether its 0.32 loader needs our fix to reuse it.

vLLM stores compiled graphs under VLLM_CACHE_ROOT (default ~/.cache/vllm). The service keeps them under its
own cache_dir, next to the demo model, so one directory (the container's cache volume) holds everything a
warm restart needs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from service.in_vllm.contract import ADDITIONAL_CONFIG_KEY, AOT_CACHE_PATCH_ENV, CACHE_ROOT_ENV, WORKER_START_ENV
from service.policy.plan.decision import PolicyResult, engine, env, record

OUTSIDE_THE_GRAPH = {WORKER_START_ENV}  # how a worker process starts changes nothing it compiles
_AFFECTED_MINOR = (0, 32)  # the release whose loader calls finalize_loading (service/in_vllm/compile_cache_patch.py)


def needs_patch(vllm_version: str | None) -> bool:
    match = re.match(r"^(\d+)\.(\d+)", vllm_version or "")
    return match is not None and (int(match[1]), int(match[2])) == _AFFECTED_MINOR


def reason(vllm_version: str | None) -> str:
    if needs_patch(vllm_version):
        return (
            f"vLLM {vllm_version} calls finalize_loading() on the loaded AOT artifact, which the CPU platform's "
            "inductor artifact lacks: every start logged 'Compiling model again due to a load failure' and "
            "recompiled; a no-op finalize_loading lets warm starts load the compiled graph"
        )
    return f"not applied on vLLM {vllm_version}: the patch targets the 0.32 loader only"


def plan_compile_cache(cache_dir: Path, vllm_version: str | None, environ: Mapping[str, str]) -> PolicyResult:
    if environ.get(CACHE_ROOT_ENV):
        root = record("env", CACHE_ROOT_ENV, environ[CACHE_ROOT_ENV], "set in the environment by the user", "user")
    else:
        root = env(
            CACHE_ROOT_ENV,
            str(cache_dir / "vllm"),
            "torch.compile artifacts under the service's cache_dir (the container's cache volume), reused by "
            "the next start with the same model and settings",
            "policy",
        )
    carried = "; carried to every vLLM process in this variable, applied there by the service's vLLM plugin"
    patch = env(
        AOT_CACHE_PATCH_ENV, "1" if needs_patch(vllm_version) else "0", reason(vllm_version) + carried, "policy"
    )
    return PolicyResult.of(root, patch)


def compile_key(planned_env: Mapping[str, str]) -> PolicyResult:
    """The service's variables (SERVICE_*: the platform and the linear kernels its vLLM plugin registers) in vLLM's
    torch.compile cache key, through additional_config, which the key hashes."""
    service = {
        name: value
        for name, value in sorted(planned_env.items())
        if name.startswith("SERVICE_") and name not in OUTSIDE_THE_GRAPH
    }
    if not service:
        return PolicyResult()
    why = (
        "vLLM keys its torch.compile cache on its own config and VLLM_* variables only: a graph compiled with "
        "other linear kernels (another bf16_weights, int4_kernel or backend) was loaded at a warm start and failed "
        "the engine start ('NoneType' object is not subscriptable); the service's variables go into "
        "additional_config, which the key hashes"
    )
    return PolicyResult.of(engine("additional_config", {ADDITIONAL_CONFIG_KEY: service}, why, "policy"))
