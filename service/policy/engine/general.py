"""The engine settings the policy passes through with their reasons: remote code, eager or compiled, max_num_seqs."""

from __future__ import annotations

from service.policy.plan.decision import PolicyResult, Source, engine
from service.settings import Settings


def general_decisions(settings: Settings, user: frozenset[str], lora: bool) -> PolicyResult:
    def src(name: str) -> Source:
        return "user" if name in user else "default"

    if settings.enforce_eager:
        compile_reason = "eager: faster start"
    elif lora:
        compile_reason = "vLLM's CPU platform runs a model with LoRA adapters eager, without torch.compile"
    else:
        compile_reason = "torch.compile: slower start, faster decode"

    return PolicyResult.of(
        engine(
            "trust_remote_code",
            settings.trust_remote_code,
            "model code from the hub runs only when enabled explicitly",
            src("trust_remote_code"),
        ),
        engine(
            "enforce_eager",
            settings.enforce_eager,
            compile_reason,
            src("enforce_eager"),
        ),
        engine("max_num_seqs", settings.max_num_seqs, "set by the user", "user") if settings.max_num_seqs else None,
    )
