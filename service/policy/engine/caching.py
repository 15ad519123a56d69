"""Prefix caching and chunked prefill: vLLM's defaults, except where the kernels keep one recurrent state per sequence
(Gated-DeltaNet models on AMX / AVX-512 BF16) or where vLLM turns prefix caching off (MLA without AMX)."""

from __future__ import annotations

from collections.abc import Mapping

from service.facts.model import ModelFacts
from service.policy.machine.backends import Backend
from service.policy.plan.decision import Decision, PolicyResult, engine, env, record
from service.settings import Settings

GDN_STATE_REASON = (
    "Gated-DeltaNet (linear-attention) model on kernels that keep one recurrent state per sequence, which "
    "prefix-cache hits and chunked prefill would resume mid-sequence (vLLM v0.23 turned both off on AMX; v0.24 "
    "dropped that guard)"
)


def cache_decisions(
    model: ModelFacts,
    backend: Backend,
    settings: Settings,
    user: frozenset[str],
    environ: Mapping[str, str],
) -> PolicyResult:
    names = ("enable_prefix_caching", "enable_chunked_prefill")
    if model.is_embedding:
        return PolicyResult.of(
            *(engine(n, getattr(settings, n), "pooling model: left to vLLM", "default") for n in names)
        )
    fresh_state = backend.kernels.gdn_state_per_sequence and model.has_linear_attention
    decisions: list[Decision] = []
    warnings: list[str] = []
    for name in names:
        value = getattr(settings, name)
        if name in user and value is not None:
            if fresh_state and value:
                warnings.append(
                    f"{name}=true set by the user on a GDN model on {backend.name}; policy would turn it off"
                )
            decisions.append(engine(name, value, "set by the user", "user"))
        elif fresh_state:
            decisions.append(engine(name, False, GDN_STATE_REASON, "policy"))
        elif model.uses_mla and not backend.kernels.mla_prefix_caching:
            why = "vLLM 0.32 turns it off for MLA models on CPUs without AMX"
            decisions.append(record("engine", name, False, why, "policy"))
        else:
            decisions.append(engine(name, True, "vLLM's default for generative models", "default"))
    if fresh_state:
        key = "VLLM_SSM_CONV_STATE_LAYOUT"
        if key in environ:
            decisions.append(record("env", key, environ[key], "already set in the environment", "user"))
        else:
            decisions.append(env(key, "SD", "conv-state layout the AMX / AVX-512 BF16 GDN kernels read", "policy"))
    return PolicyResult.of(*decisions, warnings=warnings)
