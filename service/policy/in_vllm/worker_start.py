"""How vLLM's engine core starts its workers: forked from its own imports, or spawned (service/in_vllm/worker_start.py).

vLLM's CPU platform spawns every process it starts, so a worker imports torch, vLLM and the model code again after
the engine core has; each engine start waits for it. The engine core itself stays spawned: the process that starts
it holds the service's threads and sockets.
"""

from __future__ import annotations

from service.in_vllm.contract import WORKER_START_ENV
from service.measurements.store import cite
from service.policy.plan.decision import PolicyResult, env

MEASURED = "claim/worker-start-fork"


def plan_worker_start(setting: str, user: bool) -> PolicyResult:
    """`setting`: worker_start; `user`: the user set it."""
    if setting == "spawn":
        why = "vLLM's CPU default: each worker a fresh interpreter that imports torch and vLLM again, set by the user"
        return PolicyResult.of(env(WORKER_START_ENV, "spawn", why, "user" if user else "default"))
    why = (
        "the engine core forks its workers from its own imports (vLLM's GPU default) instead of spawning them, so a "
        f"worker does not import torch and vLLM again: {cite(MEASURED)}; the engine core stays spawned, as vLLM's "
        "CPU platform has it, away from the API process's threads and sockets; set by the service's plugin in the "
        "engine core"
    )
    return PolicyResult.of(env(WORKER_START_ENV, "fork", why, "user" if user else "policy"))
