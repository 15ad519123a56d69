"""Which vLLM platform class runs the engine, and how that choice reaches every process vLLM starts.

vLLM resolves its platform anew in each process it starts (API server, engine core, workers). The service's
platform plugin (service/in_vllm/plugin.py) answers with the class named in SERVICE_VLLM_PLATFORM, which the
startup hook sets before vLLM spawns anything, so every process inherits the one decision made here.
"""

from __future__ import annotations

from collections.abc import Mapping

from service.in_vllm.contract import PLATFORM_ENV, PLATFORM_IMPORTS_ENV
from service.policy.machine.backend import BackendChoice
from service.policy.plan.decision import PolicyResult, Source, env

PLUGIN_NAME = "cpu_llm_service"  # the entry-point name in pyproject.toml, as VLLM_PLUGINS would list it

TARGET_DEVICE_REASON = (
    "vLLM 0.32 takes VLLM_TARGET_DEVICE=cpu as its platform choice and never asks platform plugins; emptied "
    "(vLLM reads empty as unset) so the service's plugin decides, and vLLM still finds its CPU build"
)


def choose_platform(backend: BackendChoice, environ: Mapping[str, str]) -> PolicyResult:
    entry = backend.entry
    if entry is None:  # no backend: the plan is refused before this
        return PolicyResult()
    short = entry.platform.rsplit(".", 1)[-1]
    source: Source = "calibration" if backend.calibrated else "policy" if backend.requested == "auto" else "user"
    decisions = [
        env(
            PLATFORM_ENV,
            entry.platform,
            f"backend {entry.name} runs on vLLM's {short} ({entry.computes_with}); the service's vLLM platform plugin "
            "returns it in every vLLM process",
            source,
        )
    ]
    if entry.platform_imports:
        modules = ",".join(entry.platform_imports)
        why = f"{short} dispatches to ops that importing {modules} registers; the plugin imports them in every vLLM process"
        decisions.append(env(PLATFORM_IMPORTS_ENV, modules, why, source))
    if environ.get("VLLM_TARGET_DEVICE", "").lower() == "cpu":
        decisions.append(env("VLLM_TARGET_DEVICE", "", TARGET_DEVICE_REASON, "policy"))
    warnings = []
    allowed = environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        warnings.append(
            f"VLLM_PLUGINS={allowed!r} leaves out the service's plugin {PLUGIN_NAME!r}: vLLM picks its platform "
            f"itself instead of {short}, and the torch patch is not applied in its processes"
        )
    return PolicyResult.of(*decisions, warnings=warnings)
