"""The plan's stages: each reads the plan's inputs and the plan so far and returns its step (policy/plan/plan_state.py).
policy/plan/plan.py runs them in order; a stage reads only what an earlier one chose."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from service.facts.api_key import api_key_of
from service.facts.hardware import HardwareFacts
from service.facts.model import ModelFacts
from service.facts.software import SoftwareFacts
from service.in_vllm.contract import KERNELS_ENV, PREPACK_ENV, THREADS_BIND_ENV
from service.policy.engine.caching import cache_decisions
from service.policy.engine.chat import chat_decisions
from service.policy.engine.decode_reads import citing_reads, kernel_blocks, read_per_token
from service.policy.engine.dtype import BYTES, choose_dtype
from service.policy.engine.general import general_decisions
from service.policy.engine.kv_cache import kv_cache_decision, model_lora_runtime
from service.policy.engine.lora import lora_decisions
from service.policy.engine.memory import plan_memory, rank_nodes
from service.policy.engine.prefill_chunk import plan_prefill_chunk
from service.policy.engine.preflight import check_kernels, dtype_limit
from service.policy.engine.sampling import plan_sampling
from service.policy.engine.speculative import plan_speculative
from service.policy.engine.top_p import plan_top_p
from service.policy.exposure.access import plan_access
from service.policy.exposure.media import plan_media
from service.policy.exposure.telemetry import plan_telemetry
from service.policy.gguf.model_source import choose_blocks, converted_bytes, plan_model_source
from service.policy.in_vllm.amx_state import amx_state
from service.policy.in_vllm.compile_cache import compile_key, plan_compile_cache
from service.policy.in_vllm.patches import fxgraph_patch
from service.policy.in_vllm.worker_start import plan_worker_start
from service.policy.linear.dense_kernel import FP32_ENGINE_BF16, plan_dense_kernel
from service.policy.linear.ggml_handover import plan_handover
from service.policy.linear.quant import plan_quant
from service.policy.machine.backend import BackendChoice, choose_backend
from service.policy.machine.platform import choose_platform
from service.policy.machine.preload import choose_preload
from service.policy.machine.threads import ThreadPlan, plan_threads, thread_decisions
from service.policy.plan.calibration import Question, Verdict, dtype_question, int4_question, w8a8_question
from service.policy.plan.calibration_candidates import (
    CALIBRATED_ENV,
    candidates,
    int4_options,
    w8a8_options,
)
from service.policy.plan.decision import PolicyResult, Source, engine, env, record
from service.policy.plan.plan_state import Draft, PlanInputs, Step

FALLBACK_MAX_MODEL_LEN = 2048


def backend(inputs: PlanInputs, draft: Draft) -> Step:
    """The backend (the table's, or the calibration's where the table chose itself), its platform and preloads."""
    table = choose_backend(inputs.hardware.cpu, inputs.software, inputs.settings.backend)
    chosen = _calibrated_backend(table, inputs.verdict("backend"), inputs.hardware, inputs.software)
    if chosen.entry is None:
        return Step(errors=(chosen.error or chosen.reason,), backend=chosen, final=True)
    results = [choose_platform(chosen, inputs.environ)]
    if inputs.libraries is not None:
        results.append(choose_preload(chosen.entry, inputs.libraries, inputs.environ))
    return Step.of_result(PolicyResult.merge(results), backend=chosen)


def threads(inputs: PlanInputs, draft: Draft) -> Step:
    s = inputs.settings
    plan = plan_threads(
        inputs.hardware.topology,
        inputs.hardware.limits,
        s.tensor_parallel_size,
        s.reserved_cpus,
        s.simulate_numa_nodes,
        inputs.environ.get(THREADS_BIND_ENV),
    )
    # The workers' OpenMP variables follow the runtime that will be preloaded, not this process's.
    return Step.of_result(thread_decisions(plan, {**inputs.environ, **draft.merged.env}), threads=plan)


def backend_options(inputs: PlanInputs, draft: Draft) -> Step:
    """The backend's own settings (zentorch's weight prepack), with the calibration's verdict (never over the user)."""
    entry = draft.entry
    own = entry.decide(inputs.settings, inputs.user) if entry.decide is not None else PolicyResult()
    verdict = inputs.verdict("zentorch_weight_prepack")
    if verdict is None or not verdict.settings or "zentorch_weight_prepack" in inputs.user:
        return Step.of_result(own, backend_own=own)
    value = "1" if verdict.settings["zentorch_weight_prepack"] else "0"
    why = f"calibrated on this machine ({verdict.chosen}; calibration.zentorch_weight_prepack)"
    decisions = tuple(
        env(PREPACK_ENV, value, why, "calibration") if d.name == PREPACK_ENV else d for d in own.decisions
    )
    return Step(decisions=decisions, warnings=own.warnings, errors=own.errors, backend_own=own)


def gguf_blocks(inputs: PlanInputs, draft: Draft) -> Step:
    """Whether a GGUF file's linear layers keep their blocks (on ggml's kernel) or are dequantized."""
    gguf = inputs.model.gguf if inputs.model else None
    if gguf is None:
        return Step()
    user = "gguf_blocks" in inputs.user
    asked = inputs.settings.gguf_blocks if user else "auto"
    return Step(
        blocks=choose_blocks(
            gguf, asked, user, inputs.software.ggml_kernel, inputs.default_model, draft.thread_plan.tp_size
        )
    )


def dtype(inputs: PlanInputs, draft: Draft) -> Step:
    """The engine's dtype; where the CPU has no native bf16 the table's choice rests on another CPU's measurement,
    so the calibration may time bf16 against fp32 here."""
    model, entry, isa = _model(inputs), draft.entry, inputs.hardware.cpu.isa
    fp32_blocked = dtype_limit(model, entry, "float32") or (
        None
        if _fits(inputs, _in_dtype(model, "float32", draft.kept_blocks), draft.thread_plan)
        else "the model's fp32 weights do not fit"
    )
    result = choose_dtype(isa, entry, inputs.settings.dtype, model.declared_dtype, fp32_blocked, inputs.default_model)
    if (
        "dtype" in inputs.user
        or isa.native_bf16
        or inputs.default_model
        or fp32_blocked is not None
        or model.quant is not None
        or not model.linear_shapes
        or not {"bfloat16", "float32"} <= set(entry.kernels.dtypes)
    ):
        return Step.of_result(result)
    envs = {d: dense_env(inputs, draft, d) for d in ("bfloat16", "float32")}
    question = dtype_question(model.linear_shapes, result.engine_args["dtype"], envs)
    verdict = inputs.verdict("dtype")
    if verdict is not None and verdict.settings:
        why = f"calibrated on this machine ({verdict.chosen}; calibration.dtype)"
        result = PolicyResult.of(engine("dtype", verdict.settings["dtype"], why, "calibration"))
    return Step.of_result(result, questions=(question,))


def context_length(inputs: PlanInputs, draft: Draft) -> Step:
    model, settings = _model(inputs), inputs.settings
    source: Source
    if settings.max_model_len:
        max_len, reason, source = settings.max_model_len, "set by the user", "user"
    elif model.max_context:
        max_len, reason, source = model.max_context, "the model's max_position_embeddings", "default"
    else:
        max_len, source = FALLBACK_MAX_MODEL_LEN, "policy"
        reason = f"the model's config declares no max context: {FALLBACK_MAX_MODEL_LEN} tokens"
    warnings = []
    if model.max_context and max_len > model.max_context:
        warnings.append(
            f"max_model_len {max_len} is past the model's max_position_embeddings ({model.max_context}): vLLM starts "
            "only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and a request past that position is outside the model's "
            "rotary table (with torch.compile the worker aborted there: 'index out of bounds', engine dead)"
        )
    return Step.of_result(PolicyResult.of(engine("max_model_len", max_len, reason, source), warnings=warnings))


def caching(inputs: PlanInputs, draft: Draft) -> Step:
    return Step.of_result(cache_decisions(_model(inputs), draft.entry, inputs.settings, inputs.user, inputs.environ))


def prefill_chunk(inputs: PlanInputs, draft: Draft) -> Step:
    """The tokens one step takes: the chunk a long prompt is prefilled in (pooling models: left to vLLM)."""
    if _model(inputs).is_embedding:
        return Step()
    chunked = draft.merged.find("engine.enable_chunked_prefill")
    args = draft.merged.engine_args
    decided = plan_prefill_chunk(
        draft.entry.name,
        inputs.settings,
        inputs.user,
        chunked is None or chunked.value is not False,
        int(args["max_model_len"]),
        int(args.get("tensor_parallel_size") or 1),
    )
    return Step.of_result(decided)


def kv_cache(inputs: PlanInputs, draft: Draft) -> Step:
    held = _in_dtype(_model(inputs), draft.dtype, draft.kept_blocks)
    max_len = int(draft.merged.engine_args["max_model_len"])
    decided = kv_cache_decision(
        inputs.hardware, held, draft.dtype, max_len, draft.thread_plan, inputs.settings, inputs.user, inputs.environ
    )
    return Step.of_result(decided)


def chat(inputs: PlanInputs, draft: Draft) -> Step:
    return Step.of_result(chat_decisions(_model(inputs), inputs.settings))


def dense_kernel(inputs: PlanInputs, draft: Draft) -> Step:
    """What runs the model's unquantized linear layers."""
    return Step.of_result(_dense(inputs, draft, draft.dtype))


def model_source(inputs: PlanInputs, draft: Draft) -> Step:
    """What the engine loads (the model, or its converted copy), under which name; a GGUF file's blocks' hand-over."""
    names, settings = inputs.vllm_names, inputs.settings
    source = plan_model_source(
        _model(inputs),
        draft.dtype,
        settings.cache_dir,
        inputs.software,
        names.text_generation_architectures if names else frozenset(),
        settings.served_model_name,
        inputs.known_as,
        draft.blocks,
        serve_unchecked=settings.gguf_unchecked == "serve",
        # a model that ships its own code names a class neither knows: trust_remote_code loads it
        loadable=names.model_architectures if names and not settings.trust_remote_code else frozenset(),
    )
    return Step.of_result(source.result + _handover(inputs, draft, source.result), source=source)


def lora(inputs: PlanInputs, draft: Draft) -> Step:
    model, settings = _model(inputs), inputs.settings
    assert draft.source is not None, "the model source stage runs first"
    runtime = model_lora_runtime(model, settings)
    return Step.of_result(lora_decisions(model, draft.source.served_name, runtime, settings.lora_max_rank))


def kernel_check(inputs: PlanInputs, draft: Draft) -> Step:
    """vLLM's CPU kernels' limits on this model (head sizes, dtypes, attention types)."""
    return Step.of_result(check_kernels(_model(inputs), draft.entry, draft.dtype, inputs.hardware.cpu.isa))


def quantization(inputs: PlanInputs, draft: Draft) -> Step:
    """The quantized layers' kernel (the calibration's where it timed one), the weight bytes a decode step reads as
    the engine holds them, and the kernel questions the user left open."""
    model, entry, dtype = _model(inputs), draft.entry, draft.dtype
    calibrated = {
        k: v for name in ("int4_kernel", "w8a8_kernel") if (x := inputs.verdict(name)) for k, v in x.settings.items()
    }
    quant = partial(_quant, inputs, draft)
    quantized = quant(calibrated)
    held = draft.merged.find("engine.linear_weights")
    reads = read_per_token(
        model,
        dtype,
        draft.kept_blocks,
        held is not None and held.value == FP32_ENGINE_BF16,
        kernel_blocks(quantized.find("quant.linear_kernel")),
    )
    questions: tuple[Question, ...] = ()
    if model.quant is not None:
        user, isa = inputs.user, inputs.hardware.cpu.isa
        int4 = int4_question(model.quant, dtype, *candidates(quant, int4_options(user, entry, model.quant.method)))
        w8a8_choices = w8a8_options(user, entry, inputs.environ, isa.vnni)
        w8a8 = w8a8_question(model.quant, dtype, *candidates(quant, w8a8_choices))
        questions = tuple(q for q in (int4, w8a8) if q is not None)
    return Step.of_result(citing_reads(quantized, reads) + PolicyResult.of(*reads), questions=questions)


def sampling(inputs: PlanInputs, draft: Draft) -> Step:
    """What a request that names no temperature samples with (policy/engine/sampling.py); a pooling model samples nothing."""
    if _model(inputs).is_embedding:
        return Step()
    user = "default_sampling" in inputs.user
    return Step.of_result(plan_sampling(inputs.default_model, inputs.settings.default_sampling, user))


def speculative(inputs: PlanInputs, draft: Draft) -> Step:
    """Whether the engine drafts tokens (policy/engine/speculative.py); a pooling model generates none."""
    if _model(inputs).is_embedding:
        return Step()
    user = "speculative" in inputs.user
    software = inputs.software
    settings = inputs.settings
    decided = plan_speculative(
        settings.speculative,
        user,
        draft.entry.name,
        software.arctic_inference,
        software.vllm,
        inputs.draft_model,
        settings.trust_remote_code,
    )
    return Step.of_result(decided)


def calibration_verdicts(inputs: PlanInputs, draft: Draft) -> Step:
    verdicts = (inputs.verdicts or {}).values()
    return Step.of_result(
        PolicyResult.of(*(record("calibration", v.decision, v.chosen, v.reason, "calibration") for v in verdicts))
    )


def general(inputs: PlanInputs, draft: Draft) -> Step:
    model, settings = inputs.model, inputs.settings
    lora = model is not None and (bool(model.lora_adapters) or settings.lora_dir is not None)
    return Step.of_result(general_decisions(settings, inputs.user, lora=lora))


def version_patches(inputs: PlanInputs, draft: Draft) -> Step:
    """The version-gated patches every vLLM process applies, the AMX tile state it asks for, and how the engine core
    starts its workers."""
    software = inputs.software
    return Step.of_result(
        plan_compile_cache(inputs.settings.cache_dir, software.vllm, inputs.environ)
        + fxgraph_patch(software.torch)
        + plan_top_p(inputs.settings.top_p_mask, "top_p_mask" in inputs.user, software.vllm)
        + amx_state(inputs.hardware.cpu.isa)
        + plan_worker_start(inputs.settings.worker_start, "worker_start" in inputs.user)
    )


def compile_cache_key(inputs: PlanInputs, draft: Draft) -> Step:
    """torch.compile's cache key, over the environment every decision before it set."""
    return Step.of_result(compile_key(draft.merged.env))


def access(inputs: PlanInputs, draft: Draft) -> Step:
    """Who may call the port. Shown by every plan and refused by serve alone (startup/sequence.py): detect describes
    the machine and the model, and an image's detect runs without the key its deployment mounts."""
    settings = inputs.settings
    planned = plan_access(settings.host, api_key_of(settings), settings.allow_unauthenticated, settings.allowed_hosts)
    refusals = tuple(f"serve refuses to start: {error}" for error in planned.errors)
    return Step(decisions=planned.decisions, warnings=planned.warnings + refusals)


def telemetry(inputs: PlanInputs, draft: Draft) -> Step:
    return Step.of_result(plan_telemetry(inputs.environ))


def media(inputs: PlanInputs, draft: Draft) -> Step:
    return Step.of_result(plan_media(inputs.settings.media_domains))


def _model(inputs: PlanInputs) -> ModelFacts:
    assert inputs.model is not None, "a model stage runs only with a model"
    return inputs.model


def _dense(inputs: PlanInputs, draft: Draft, dtype: str) -> PolicyResult:
    """What runs the model's unquantized linear layers in an engine of `dtype`."""
    model = _model(inputs)
    return plan_dense_kernel(
        model.quant,
        model.declared_dtype,
        draft.entry,
        dtype,
        inputs.hardware.cpu.isa.native_bf16,
        inputs.settings,
        inputs.user,
        inputs.software.ggml_kernel,
        draft.kept_blocks,
    )


def dense_env(inputs: PlanInputs, draft: Draft, dtype: str) -> dict[str, str]:
    """What the dense kernels of an engine of `dtype` read (the service's bf16 kernel), for calibration candidates."""
    return {k: v for k, v in _dense(inputs, draft, dtype).env.items() if k in CALIBRATED_ENV}


def _handover(inputs: PlanInputs, draft: Draft, kernels: PolicyResult) -> PolicyResult:
    """Where the ggml op hands batches to the GEMM, if `kernels` run it."""
    entry = draft.entry
    native_bf16 = inputs.hardware.cpu.isa.native_bf16
    return plan_handover(entry.name, entry.ggml_handover, draft.dtype, native_bf16, kernels.env.get(KERNELS_ENV, ""))


def _quant(inputs: PlanInputs, draft: Draft, calibrated: dict[str, Any]) -> PolicyResult:
    """The quantized layers' kernel (and its hand-over, which a calibration candidate carries too)."""
    model, software = _model(inputs), inputs.software
    result = plan_quant(
        model.quant,
        draft.entry,
        draft.dtype,
        inputs.settings,
        inputs.environ,
        inputs.vllm_names.quantization_methods if inputs.vllm_names else None,
        software.auto_round_lib,
        calibrated,
        software.ggml_kernel,
        vnni=inputs.hardware.cpu.isa.vnni,
    )
    return result + _handover(inputs, draft, result)


def _calibrated_backend(
    table: BackendChoice, verdict: Verdict | None, hardware: HardwareFacts, software: SoftwareFacts
) -> BackendChoice:
    """The backend the calibration chose over the table's (only where the table chose itself, never the user)."""
    if verdict is None or not verdict.settings or table.requested != "auto" or table.entry is None:
        return table
    chosen = choose_backend(hardware.cpu, software, verdict.settings["backend"])
    if chosen.entry is None or chosen.name == table.name:
        return table
    why = (
        f"calibrated on this machine: {chosen.name} ran the model's linear layers faster than {table.name} "
        f"(calibration.backend); {chosen.reason}"
    )
    return replace(chosen, reason=why, requested="auto", calibrated=True)


def _in_dtype(model: ModelFacts, dtype: str, kept_blocks: str | None = None) -> ModelFacts:
    """The model as the engine holds it: unquantized weights are cast to the engine dtype at load; a GGUF file's
    kept blocks (`kept_blocks`) stay as the file stores them."""
    if kept_blocks and model.gguf is not None:
        return replace(model, weight_bytes=converted_bytes(model.gguf, dtype, kept_blocks))
    stored = BYTES.get(model.declared_dtype or "")
    if model.quant is not None or stored is None or stored == BYTES[dtype]:
        return model
    return replace(model, weight_bytes=model.weight_bytes * BYTES[dtype] // stored)


def _fits(inputs: PlanInputs, model: ModelFacts, threads: ThreadPlan) -> bool:
    """Weights, headroom and one request of the model's own context fit the memory limit and each rank's NUMA node
    (or they are unknown)."""
    hardware, settings = inputs.hardware, inputs.settings
    plan = plan_memory(
        hardware.limits,
        model,
        dtype_bytes=BYTES["float32"],
        max_model_len=settings.max_model_len or model.max_context or FALLBACK_MAX_MODEL_LEN,
        tp_size=threads.tp_size,
        max_num_seqs=settings.max_num_seqs,
        kv_cache_gib=None,
        headroom_gib=settings.memory_headroom_gib,
        rank_memory=rank_nodes(threads.ranks, hardware.topology.nodes, hardware.node_memory),
    )
    return plan.error is None
