"""Whether every vLLM process masks top-p from the top tokens instead of sorting the vocabulary
(service/in_vllm/top_p.py).

vLLM 0.32's CPU sampler sorts each row of logits over the whole vocabulary for top-p; the service's function takes
the nucleus from `topk` and keeps the same tokens. The function it replaces (and its signature) is that vLLM
version's. `top_p_mask=sort` keeps vLLM's own (the bench's A/B, or a way out).
"""

from __future__ import annotations

from service.in_vllm.contract import TOP_P_ENV
from service.measurements.store import cite
from service.policy.plan.decision import PolicyResult, env

MEASURED = "claim/top-p-partial"


def plan_top_p(setting: str, user: bool, vllm: str | None) -> PolicyResult:
    """`setting`: top_p_mask; `user`: the user set it; `vllm`: its version."""
    if setting == "sort":
        why = "vLLM's own top-p (a sort of the vocabulary), set by the user"
        return PolicyResult.of(env(TOP_P_ENV, "sort", why, "user" if user else "default"))
    if not (vllm or "").startswith("0.32."):
        why = f"the service's top-p is written against vLLM 0.32's sampler, not {vllm}"
        if setting == "partial":
            return PolicyResult(errors=(f"top_p_mask=partial: {why}; top_p_mask=sort runs vLLM's own",))
        return PolicyResult.of(env(TOP_P_ENV, "sort", f"vLLM's own top-p: {why}", "policy"))
    why = (
        "top-p taken from the top tokens (topk) instead of vLLM 0.32's sort of the whole vocabulary, the same tokens "
        f"kept: {cite(MEASURED)}; applied in every vLLM process by the service's plugin"
    )
    return PolicyResult.of(env(TOP_P_ENV, "partial", why, "user" if user else "policy"))
