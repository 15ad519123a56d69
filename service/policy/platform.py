"""Which vLLM platform class runs the engine, and how that choice reaches every process vLLM starts.

vLLM resolves its platform anew in each process it starts (API server, engine core, workers). The service's
platform plugin (service/vllm_plugin.py) answers with the class named in SERVICE_VLLM_PLATFORM, which the
startup hook sets before vLLM spawns anything, so every process inherits the one decision made here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from service.policy.backend import BackendChoice
from service.policy.decision import Decision, Source

PLATFORM_ENV = "SERVICE_VLLM_PLATFORM"
PLUGIN_NAME = "cpu_llm_service"  # the entry-point name in pyproject.toml, as VLLM_PLUGINS would list it

TARGET_DEVICE_REASON = (
    "vLLM 0.32 takes VLLM_TARGET_DEVICE=cpu as its platform choice and never asks platform plugins; emptied "
    "(vLLM reads empty as unset) so the service's plugin decides, and vLLM still finds its CPU build"
)


@dataclass(frozen=True)
class PlatformChoice:
    decisions: tuple[Decision, ...]
    env: dict[str, str] = field(default_factory=dict)  # set in the API server before vLLM spawns
    warnings: tuple[str, ...] = ()


def choose_platform(backend: BackendChoice, environ: Mapping[str, str]) -> PlatformChoice:
    qualname = backend.platform
    if qualname is None:  # no backend: the plan is refused before this
        return PlatformChoice(())
    short = qualname.rsplit(".", 1)[-1]
    what = "zentorch's kernels" if backend.name == "zen" else "the kernel build vLLM picks from the CPU"
    source: Source = "policy" if backend.requested == "auto" else "user"
    decisions = [
        Decision(
            f"env.{PLATFORM_ENV}",
            qualname,
            f"backend {backend.name} runs on vLLM's {short} ({what}); the service's vLLM platform plugin returns "
            "it in every vLLM process",
            source,
        )
    ]
    env = {PLATFORM_ENV: qualname}
    if environ.get("VLLM_TARGET_DEVICE", "").lower() == "cpu":
        decisions.append(Decision("env.VLLM_TARGET_DEVICE", "", TARGET_DEVICE_REASON, "policy"))
        env["VLLM_TARGET_DEVICE"] = ""
    warnings: tuple[str, ...] = ()
    allowed = environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        warnings = (
            f"VLLM_PLUGINS={allowed!r} leaves out the service's plugin {PLUGIN_NAME!r}: vLLM picks its platform "
            f"itself instead of {short}, and the torch patch is not applied in its processes",
        )
    return PlatformChoice(tuple(decisions), env, warnings)
