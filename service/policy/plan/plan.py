"""Engine arguments and environment for vLLM: a pure function of the plan's inputs (hardware, model, software,
settings, environment), decided in ordered stages.

Plays for the service the role `CpuPlatform.check_and_update_config` plays inside vLLM. Each stage
(policy/plan/stages.py) returns its decisions and the speed questions the calibration may time for it; they merge here in
stage order, and the engine arguments and the environment are read off the merged decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from service.in_vllm.contract import KERNELS_ENV, PREPACK_ENV
from service.policy.gguf.model_source import ModelSourcePlan
from service.policy.machine.backend import BackendChoice
from service.policy.machine.threads import ThreadPlan
from service.policy.plan import stages
from service.policy.plan.calibration import Candidate, Question, backend_question
from service.policy.plan.calibration_candidates import prepack_question
from service.policy.plan.decision import PolicyResult
from service.policy.plan.plan_state import Draft, PlanInputs, Stage, Step


@dataclass(frozen=True, kw_only=True)
class EnginePlan(PolicyResult):
    """Every decision merged (engine_args: kwargs for vLLM's AsyncEngineArgs; env: set in this process before vLLM
    starts, inherited by every vLLM process), with the structured plans the report and the server read."""

    backend: BackendChoice
    threads: ThreadPlan | None
    model: ModelSourcePlan | None = None  # what the engine loads, under which name (None: no model)
    questions: tuple[Question, ...] = ()  # speed decisions the calibration can time here (policy/plan/calibration.py)


def plan_engine(inputs: PlanInputs) -> EnginePlan:
    draft, refused = Draft(), False
    for stage in STAGES:
        if (stage.needs_model and inputs.model is None) or (refused and not stage.always):
            continue
        step = stage.run(inputs, draft)
        draft = draft.after(step)
        refused = refused or step.final
    assert draft.backend is not None, "the backend stage runs first"
    merged = draft.merged
    return EnginePlan(
        decisions=merged.decisions,
        warnings=merged.warnings,
        errors=merged.errors,
        backend=draft.backend,
        threads=draft.threads,
        model=draft.source,
        questions=draft.questions,
    )


def backend_questions(inputs: PlanInputs, draft: Draft) -> Step:
    """zentorch's weight prepack, and the backend's own kernels against vLLM's generic ones for an unquantized
    model's linear layers where the backend chose itself and has a lowering: each candidate times what its
    backend's engine would run, the lowering in a process started with that backend's environment (platform,
    preloads, OpenMP runtime), which is the whole plan under that backend."""
    model, entry, dtype = inputs.model, draft.entry, draft.dtype
    assert model is not None and draft.backend is not None
    questions = prepack_question(model, draft.backend_own, dtype)
    if (
        draft.backend.calibrated
        or draft.backend.requested != "auto"
        or model.quant is not None
        or not model.linear_shapes
    ):
        return Step(questions=questions)
    own_env = {d.name: str(d.value) for d in draft.backend_own.decisions if d.name == PREPACK_ENV}
    own = Candidate(entry.name, {"backend": entry.name}, entry.name, own_env | stages.dense_env(inputs, draft, dtype))
    candidates = [own]
    for name in entry.lowers_to:
        settings = inputs.settings.model_copy(update={"backend": name})
        plan = plan_engine(replace(inputs, settings=settings, verdicts=None))
        if plan.ok:
            kernels = {k: v for k, v in plan.env.items() if k == KERNELS_ENV}
            candidates.append(Candidate(name, {"backend": name}, name, kernels, process_env=plan.env))
    if len(candidates) > 1:
        questions += (backend_question(entry.name, tuple(candidates), model.linear_shapes, dtype),)
    return Step(questions=questions)


STAGES: tuple[Stage, ...] = (
    Stage("backend", stages.backend),
    Stage("threads", stages.threads),
    Stage("backend options", stages.backend_options),
    Stage("gguf blocks", stages.gguf_blocks, needs_model=True),
    Stage("dtype", stages.dtype, needs_model=True),
    Stage("context length", stages.context_length, needs_model=True),
    Stage("prefix caching and chunked prefill", stages.caching, needs_model=True),
    Stage("prefill chunk", stages.prefill_chunk, needs_model=True),
    Stage("kv cache", stages.kv_cache, needs_model=True),
    Stage("chat parsers", stages.chat, needs_model=True),
    Stage("backend questions", backend_questions, needs_model=True),
    Stage("dense kernel", stages.dense_kernel, needs_model=True),
    Stage("model source", stages.model_source, needs_model=True),
    Stage("lora", stages.lora, needs_model=True),
    Stage("kernel limits", stages.kernel_check, needs_model=True),
    Stage("quantization", stages.quantization, needs_model=True),
    Stage("sampling defaults", stages.sampling, needs_model=True),
    Stage("speculative decoding", stages.speculative, needs_model=True),
    Stage("calibration verdicts", stages.calibration_verdicts),
    Stage("general", stages.general),
    Stage("version patches", stages.version_patches),
    Stage("compile cache key", stages.compile_cache_key),
    Stage("access", stages.access, always=True),
    Stage("usage statistics", stages.telemetry),
    Stage("remote media", stages.media),
)
