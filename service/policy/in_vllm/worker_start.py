"""How vLLM starts its engine core and workers: forked from their parent's imports, or spawned
(service/in_vllm/worker_start.py).

vLLM's CPU platform spawns every process it starts, so the engine core imports torch and vLLM again after the API
process has, and a worker after its engine core has; each engine start waits for both.
"""

from __future__ import annotations

from service.in_vllm.contract import WORKER_START_ENV
from service.measurements.store import cite
from service.policy.plan.decision import PolicyResult, env

MEASURED = "claim/process-start-fork"


def plan_worker_start(setting: str, user: bool) -> PolicyResult:
    """`setting`: worker_start; `user`: the user set it."""
    if setting == "spawn":
        why = (
            "vLLM's CPU default: the engine core and each worker a fresh interpreter that imports torch and vLLM "
            "again, set by the user"
        )
        return PolicyResult.of(env(WORKER_START_ENV, "spawn", why, "user" if user else "default"))
    why = (
        "vLLM's processes forked from their parent's imports instead of spawned (vLLM's GPU default): the engine core "
        "from the API process, which leaves the child none of its listening sockets, and each worker from its engine "
        f"core, so neither imports torch and vLLM again: {cite(MEASURED)}"
    )
    return PolicyResult.of(env(WORKER_START_ENV, "fork", why, "user" if user else "policy"))
