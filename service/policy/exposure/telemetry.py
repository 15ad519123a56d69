"""vLLM's usage statistics, off in every vLLM process: by default vLLM sends the hardware, the model's architecture
and the engine settings to its usage server. The Kubernetes manifests alone turned it off; as part of the plan it
is off in the image, under compose and on bare metal alike. A user who set either variable keeps their value."""

from __future__ import annotations

from collections.abc import Mapping

from service.policy.plan.decision import PolicyResult, env, record

OFF = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
WHY = "no usage statistics leave the machine (vLLM's usage server would get the hardware, model and settings)"


def plan_telemetry(environ: Mapping[str, str]) -> PolicyResult:
    decisions = [
        record("env", name, environ[name], "set by the user", "user")
        if name in environ
        else env(name, value, WHY, "policy")
        for name, value in OFF.items()
    ]
    return PolicyResult.of(*decisions)
