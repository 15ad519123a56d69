"""What a request that names no temperature samples with. vLLM's default is the model's generation config, else
temperature 1; agents (Claude Code, Codex CLI) send none. The packaged default model, SmolLM2-135M, given an agent's
prompt at temperature 1 mostly writes on to the end of its context instead of ending its answer (minutes on one
core, then a prompt too long for the agent's next request); greedy, it ends. So for that model the default is
greedy, as a request that asks for temperature 0 gets; a request that names its temperature is served as it asks.
Other models keep their own generation config: a model of the user's own was tuned for it."""

from __future__ import annotations

from service.measurements.store import cite
from service.policy.plan.decision import PolicyResult, Source, engine

GREEDY = {"temperature": 0.0}
MEASURED = "claim/default-model-agent-stop/amx"


def plan_sampling(default_model: bool, setting: str, user: bool) -> PolicyResult:
    """`default_model`: no model configured (the packaged SmolLM2); `setting`: default_sampling (auto | off)."""
    source: Source = "user" if user else "policy"
    if setting == "off":
        why = "off: the model's generation config, else vLLM's temperature 1, where a request names no temperature"
        return PolicyResult.of(engine("override_generation_config", None, why, source))
    if not default_model:
        why = "the model's generation config (vLLM's temperature 1 where it has none) for a request that names none"
        return PolicyResult.of(engine("override_generation_config", None, why, "default"))
    why = f"greedy where a request names no temperature (agents name none): {cite(MEASURED)}"
    return PolicyResult.of(engine("override_generation_config", GREEDY, why, source))
