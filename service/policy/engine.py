"""Engine arguments and environment for vLLM: a pure function of (hardware, model, software, settings, env).

Plays for the service the role `CpuPlatform.check_and_update_config` plays inside vLLM. Each decision area (the
modules of this package) returns a PolicyResult; they merge here, in one place, and the engine arguments and the
environment are read off the merged decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from service.facts.hardware import HardwareFacts
from service.facts.libraries import LibraryFacts
from service.facts.model import DecodeReads, ModelFacts
from service.facts.software import SoftwareFacts
from service.facts.vllm_source import VllmNames
from service.policy.amx_state import amx_state
from service.policy.backend import BackendChoice, choose_backend
from service.policy.backends import Backend
from service.policy.calibration import (
    Candidate,
    Question,
    Verdict,
    backend_question,
    dense_question,
    dtype_question,
    int4_question,
    w8a8_question,
)
from service.policy.chat import chat_decisions
from service.policy.compile_cache import compile_key, plan_compile_cache
from service.policy.decision import Decision, PolicyResult, Source, engine, env, record
from service.policy.dense_kernel import FP32_ENGINE_BF16, plan_dense_kernel
from service.policy.dtype import BYTES, choose_dtype
from service.policy.ggml_handover import HANDOVER_ENV, plan_handover
from service.policy.kernels import check_kernels, dtype_limit
from service.policy.kv_cache_dtype import plan_kv_cache_dtype
from service.policy.lora import LoraRuntime, lora_decisions, lora_runtime, lora_slot_bytes
from service.policy.memory import plan_memory, rank_nodes
from service.policy.model_source import (
    ModelSourcePlan,
    choose_blocks,
    converted_bytes,
    held_as,
    kept_bytes,
    kept_heads,
    plan_model_source,
)
from service.policy.patches import fxgraph_patch
from service.policy.platform import choose_platform
from service.policy.preload import choose_preload
from service.policy.quant import plan_quant
from service.policy.quant_kernels import KERNELS, KERNELS_ENV
from service.policy.threads import BIND_ENV, ThreadPlan, plan_threads, thread_decisions
from service.settings import Settings

GDN_STATE_REASON = (
    "Gated-DeltaNet (linear-attention) model on kernels that keep one recurrent state per sequence, which "
    "prefix-cache hits and chunked prefill would resume mid-sequence (vLLM v0.23 turned both off on AMX; v0.24 "
    "dropped that guard)"
)

FALLBACK_MAX_MODEL_LEN = 2048


@dataclass(frozen=True, kw_only=True)
class EnginePlan(PolicyResult):
    """Every decision merged (engine_args: kwargs for vLLM's AsyncEngineArgs; env: set in this process before vLLM
    starts, inherited by every vLLM process), with the structured plans the report and the server read."""

    backend: BackendChoice
    threads: ThreadPlan | None
    model: ModelSourcePlan | None = None  # what the engine loads, under which name (None: no model)
    questions: tuple[Question, ...] = ()  # speed decisions the calibration can time here (policy/calibration.py)

    @classmethod
    def of_results(
        cls,
        results: list[PolicyResult],
        backend: BackendChoice,
        threads: ThreadPlan | None,
        model: ModelSourcePlan | None,
        questions: tuple[Question, ...] = (),
    ) -> EnginePlan:
        merged = PolicyResult.merge(results)
        return cls(
            decisions=merged.decisions,
            warnings=merged.warnings,
            errors=merged.errors,
            backend=backend,
            threads=threads,
            model=model,
            questions=questions,
        )


def build_plan(
    hardware: HardwareFacts,
    model: ModelFacts | None,
    software: SoftwareFacts,
    settings: Settings,
    environ: Mapping[str, str],
    libraries: LibraryFacts | None = None,  # None: not read, no preload decision
    vllm_names: VllmNames | None = None,  # None: not read, architectures and quantization methods not checked
    known_as: str | None = None,  # the name the model was asked for by (the demo's, a hub id), if not a path
    default_model: bool = False,  # the packaged default model (no model configured)
    verdicts: Mapping[str, Verdict] | None = None,  # the calibration's, per decision (None: not calibrated)
) -> EnginePlan:
    user = settings.explicitly_set()
    verdicts = verdicts or {}
    table_backend = choose_backend(hardware.cpu, software, settings.backend)
    backend = _calibrated_backend(table_backend, verdicts.get("backend"), hardware, software)
    entry = backend.entry
    if entry is None:
        return EnginePlan(errors=(backend.error or backend.reason,), backend=backend, threads=None)

    results = [choose_platform(backend, environ)]
    if libraries is not None:
        results.append(choose_preload(entry, libraries, environ))
    threads = plan_threads(
        hardware.topology,
        hardware.limits,
        settings.tensor_parallel_size,
        settings.reserved_cpus,
        settings.simulate_numa_nodes,
        environ.get(BIND_ENV),
    )
    # The workers' OpenMP variables follow the runtime that will be preloaded, not this process's.
    results.append(thread_decisions(threads, {**environ, **PolicyResult.merge(results).env}))
    backend_decided = entry.decide(settings, user) if entry.decide is not None else PolicyResult()
    results.append(_calibrated(backend_decided, verdicts.get("zentorch_weight_prepack"), user))
    source: ModelSourcePlan | None = None
    questions: tuple[Question, ...] = ()
    if model is not None:
        blocks = None
        if model.gguf is not None:
            asked = settings.gguf_blocks if "gguf_blocks" in user else "auto"
            blocks = choose_blocks(
                model.gguf, asked, "gguf_blocks" in user, software.ggml_kernel, default_model, threads.tp_size
            )
        kept_blocks = blocks.type_name if blocks else None

        def dense(dtype: str) -> PolicyResult:
            """What runs the model's unquantized linear layers in an engine of `dtype`."""
            return plan_dense_kernel(
                model.quant,
                model.declared_dtype,
                entry,
                dtype,
                hardware.cpu.isa.native_bf16,
                settings,
                user,
                software.ggml_kernel,
                kept_blocks,
            )

        def dense_env(dtype: str) -> dict[str, str]:
            """What those kernels read (the service's bf16 kernel), for the calibration's candidates."""
            return {k: v for k, v in dense(dtype).env.items() if k in CALIBRATED_ENV}

        decided, dtype_question = _model_decisions(
            hardware,
            model,
            entry,
            settings,
            user,
            environ,
            threads,
            default_model,
            verdicts.get("dtype"),
            kept_blocks,
            dense_env,
        )
        results.append(decided)
        dtype = decided.engine_args["dtype"]
        questions += dtype_question + _prepack_question(model, backend_decided, dtype)
        if backend is table_backend:

            def lowered(name: str) -> EnginePlan:
                return build_plan(
                    hardware,
                    model,
                    software,
                    settings.model_copy(update={"backend": name}),
                    environ,
                    libraries,
                    vllm_names,
                    known_as,
                    default_model,
                )

            questions += _backend_question(model, backend, backend_decided, dense_env(dtype), dtype, lowered)
        architectures = vllm_names.text_generation_architectures if vllm_names else frozenset()
        source = plan_model_source(
            model,
            dtype,
            settings.cache_dir,
            software,
            architectures,
            settings.served_model_name,
            known_as,
            blocks,
            serve_unchecked=settings.gguf_unchecked == "serve",
            # a model that ships its own code names a class neither knows: trust_remote_code loads it
            loadable=vllm_names.model_architectures if vllm_names and not settings.trust_remote_code else frozenset(),
        )
        known_methods = vllm_names.quantization_methods if vllm_names else None
        calibrated = {
            k: v for name in ("int4_kernel", "w8a8_kernel") if (x := verdicts.get(name)) for k, v in x.settings.items()
        }

        def handover(kernels: PolicyResult) -> PolicyResult:
            """Where the ggml op hands batches to the GEMM, if `kernels` run it."""
            native_bf16 = hardware.cpu.isa.native_bf16
            return plan_handover(entry.name, entry.ggml_handover, dtype, native_bf16, kernels.env.get(KERNELS_ENV, ""))

        def quant(calibrated: Mapping[str, Any]) -> PolicyResult:
            """The quantized layers' kernel (and its hand-over, which a calibration candidate carries too)."""
            result = plan_quant(
                model.quant,
                entry,
                dtype,
                settings,
                environ,
                known_methods,
                software.auto_round_lib,
                calibrated,
                software.ggml_kernel,
                vnni=hardware.cpu.isa.vnni,
            )
            return result + handover(result)

        dense_decided = dense(dtype)
        held = dense_decided.find("engine.linear_weights")
        quantized = quant(calibrated)
        # A GGUF file's blocks are read as ggml holds them; projections an fp32 engine keeps bf16, in bf16; a
        # checkpoint's quantized layers as its kernel holds them.
        reads = _read_per_token(
            model,
            dtype,
            kept_blocks,
            held is not None and held.value == FP32_ENGINE_BF16,
            _kernel_blocks(quantized.find("quant.linear_kernel")),
        )
        results.append(dense_decided)
        results += [
            source.result,
            handover(source.result),  # a GGUF file's blocks
            lora_decisions(model, source.served_name, _lora_runtime(model, settings), settings.lora_max_rank),
            check_kernels(model, entry, dtype, hardware.cpu.isa),
            _citing_reads(quantized, reads),
            PolicyResult.of(*reads),
        ]
        if model.quant is not None:
            int4 = int4_question(
                model.quant, dtype, *_candidates(quant, _int4_options(user, entry, model.quant.method))
            )
            w8a8 = w8a8_question(
                model.quant, dtype, *_candidates(quant, _w8a8_options(user, entry, environ, hardware.cpu.isa.vnni))
            )
            questions += tuple(q for q in (int4, w8a8) if q is not None)
    results += [
        PolicyResult.of(record("calibration", v.decision, v.chosen, v.reason, "calibration")) for v in verdicts.values()
    ]
    results += [
        _general_decisions(
            settings, user, lora=model is not None and (bool(model.lora_adapters) or settings.lora_dir is not None)
        ),
        plan_compile_cache(settings.cache_dir, software.vllm, environ),
        fxgraph_patch(software.torch),
        amx_state(hardware.cpu.isa),
    ]
    results.append(compile_key(PolicyResult.merge(results).env))
    return EnginePlan.of_results(results, backend, threads, source, questions)


CALIBRATED_ENV = ("VLLM_CPU_INT4_W4A8", "VLLM_DISABLED_KERNELS", KERNELS_ENV, HANDOVER_ENV)


def _int4_options(user: frozenset[str], backend: Backend, method: str) -> list[tuple[str, dict[str, Any]]]:
    """The int4 settings the calibration can weigh here: none the user set."""
    if "int4_kernel" in user:
        return []
    w4a8: list[bool | None] = [None]
    if "int4_w4a8" not in user and backend.int4_w4a8 is not None and method in backend.int4_w4a8.methods:
        w4a8 = [False, True]
    options: list[tuple[str, dict[str, Any]]] = [
        (
            "vllm" if a is None else f"vllm-{'w4a8' if a else 'weight-only'}",
            {"int4_kernel": "vllm"} | ({} if a is None else {"int4_w4a8": a}),
        )
        for a in w4a8
    ]
    return [*options, ("auto-round", {"int4_kernel": "auto-round"}), ("ggml", {"int4_kernel": "ggml"})]


def _w8a8_options(
    user: frozenset[str], backend: Backend, environ: Mapping[str, str], vnni: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The W8A8 settings the calibration can weigh here: vLLM's kernel (zentorch's or oneDNN's where the backend has
    both and neither the user's setting nor their VLLM_DISABLED_KERNELS chose) or the service's ggml one. Where the
    user set int8_kernel, every option plans their kernel and they fold into one candidate. Without VNNI vLLM's
    oneDNN kernel saturates (quant_kernels.SATURATES_WITHOUT_VNNI): its speed is not weighed against an exact one."""
    if not vnni:
        return [("ggml", {"int8_kernel": "ggml"})]
    vllm: list[tuple[str, dict[str, Any]]] = [("vllm", {"int8_kernel": "vllm"})]
    if backend.w8a8_zentorch and "w8a8_zentorch" not in user and "VLLM_DISABLED_KERNELS" not in environ:
        vllm = [
            (name, {"int8_kernel": "vllm", "w8a8_zentorch": on}) for name, on in (("zentorch", True), ("onednn", False))
        ]
    return [*vllm, ("ggml", {"int8_kernel": "ggml"})]


def _candidates(
    quant: Callable[[Mapping[str, Any]], PolicyResult], options: list[tuple[str, dict[str, Any]]]
) -> tuple[tuple[Candidate, ...], str]:
    """Each option with what the policy then runs (kernel, the environment the kernels read), options that plan the
    same kernel being one candidate; and the name of the one the table picks."""

    def planned(settings: Mapping[str, Any]) -> tuple[str | None, dict[str, str], bool]:
        result = quant(settings)
        kernel = next((d.value for d in result.decisions if d.setting == "quant.linear_kernel"), None)
        return kernel, {k: v for k, v in result.env.items() if k in CALIBRATED_ENV}, bool(result.errors)

    seen: dict[str, Candidate] = {}
    for name, settings in options:
        kernel, env_, failed = planned(settings)
        if not failed and kernel is not None:
            seen.setdefault(kernel, Candidate(name, settings, kernel, env_))
    default = seen.get(str(planned({})[0]))
    return tuple(seen.values()), default.name if default else ""


def _model_decisions(
    hardware: HardwareFacts,
    model: ModelFacts,
    backend: Backend,
    settings: Settings,
    user: frozenset[str],
    environ: Mapping[str, str],
    threads: ThreadPlan,
    default_model: bool,
    verdict: Verdict | None,
    kept_blocks: str | None,  # the types a GGUF file's linear layers keep (choose_blocks)
    dense_env: Callable[[str], Mapping[str, str]],  # per engine dtype, what its dense linear kernel reads
) -> tuple[PolicyResult, tuple[Question, ...]]:
    isa = hardware.cpu.isa
    fp32_blocked = dtype_limit(model, backend, "float32") or (
        None
        if _fits(hardware, _in_dtype(model, "float32", kept_blocks), settings, threads)
        else "the model's fp32 weights do not fit"
    )
    dtype_result = choose_dtype(isa, backend, settings.dtype, model.declared_dtype, fp32_blocked, default_model)
    table_dtype = dtype_result.engine_args["dtype"]
    questions: tuple[Question, ...] = ()
    # Without native bf16 the table's dtype rests on another CPU's measurement: time both here.
    if (
        "dtype" not in user
        and not isa.native_bf16
        and not default_model
        and fp32_blocked is None
        and model.quant is None
        and model.linear_shapes
        and {"bfloat16", "float32"} <= set(backend.kernels.dtypes)
    ):
        dtypes = ("bfloat16", "float32")
        questions = (dtype_question(model.linear_shapes, table_dtype, {d: dense_env(d) for d in dtypes}),)
        if verdict is not None and verdict.settings:
            why = f"calibrated on this machine ({verdict.chosen}; calibration.dtype)"
            dtype_result = PolicyResult.of(engine("dtype", verdict.settings["dtype"], why, "calibration"))
    dtype = dtype_result.engine_args["dtype"]

    len_source: Source
    if settings.max_model_len:
        max_len, len_reason, len_source = settings.max_model_len, "set by the user", "user"
    elif model.max_context:
        max_len, len_reason, len_source = model.max_context, "the model's max_position_embeddings", "default"
    else:
        max_len, len_source = FALLBACK_MAX_MODEL_LEN, "policy"
        len_reason = f"the model's config declares no max context: {FALLBACK_MAX_MODEL_LEN} tokens"
    warnings = []
    if model.max_context and max_len > model.max_context:
        warnings.append(
            f"max_model_len {max_len} is past the model's max_position_embeddings ({model.max_context}): vLLM starts "
            "only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and a request past that position is outside the model's "
            "rotary table (with torch.compile the worker aborted there: 'index out of bounds', engine dead)"
        )
    decided = PolicyResult.merge(
        [
            dtype_result,
            PolicyResult.of(engine("max_model_len", max_len, len_reason, len_source), warnings=warnings),
            _cache_decisions(model, backend, settings, user, environ),
            _kv_decision(
                hardware, _in_dtype(model, dtype, kept_blocks), dtype, max_len, threads, settings, user, environ
            ),
            chat_decisions(model, settings),
        ]
    )
    return decided, questions


PREPACK_ENV = "VLLM_ZENTORCH_WEIGHT_PREPACK"


def _prepack_question(model: ModelFacts, backend_decided: PolicyResult, dtype: str) -> tuple[Question, ...]:
    """zentorch's weight prepack, where the backend decides it and the user did not: on or off for the model's
    unquantized linear layers ("faster GEMMs" is zentorch's claim, not a measurement on this CPU)."""
    decided = next((d for d in backend_decided.decisions if d.name == PREPACK_ENV), None)
    if decided is None or decided.source == "user" or model.quant is not None or not model.linear_shapes:
        return ()
    candidates = tuple(
        Candidate(name, {"zentorch_weight_prepack": on}, name, {PREPACK_ENV: "1" if on else "0"})
        for name, on in (("prepacked", True), ("not-prepacked", False))
    )
    default = "prepacked" if decided.value == "1" else "not-prepacked"
    return (dense_question("zentorch_weight_prepack", default, candidates, model.linear_shapes, dtype),)


def _kernel_blocks(kernel: Decision | None) -> tuple[str, int] | None:
    """(kernel, bytes per 32 weights) where every quantized layer runs one kernel that holds them as blocks."""
    chosen = KERNELS.get(str(kernel.value)) if kernel is not None else None
    return (str(kernel.value), chosen.block_bytes) if kernel is not None and chosen and chosen.block_bytes else None


def _read_per_token(
    model: ModelFacts,
    dtype: str,
    gguf_blocks: str | None = None,
    bf16_projections: bool = False,
    kernel_blocks: tuple[str, int] | None = None,
) -> tuple[Decision, ...]:
    """The weight bytes one decode step reads, as the engine holds them: what bounds batch-1 decode on a CPU.
    `gguf_blocks`: the type a GGUF file's linear layers keep, read as ggml's op holds them. `bf16_projections`: the
    service's bf16-weight kernel holds the decoder's projections in bf16 (engine.linear_weights). `kernel_blocks`:
    the quantized layers' kernel and the bytes per 32 weights it holds them in (_kernel_blocks)."""
    reads = model.decode_reads
    stored = "quantized values and zero points as stored"
    if reads is not None and gguf_blocks and model.gguf is not None:
        stored_bytes, stored_elements = kept_bytes(model.gguf, per_token=True)
        reads = DecodeReads(model.gguf.read_per_token_elements - stored_elements, stored_bytes)
        head = [h.type_name for h in kept_heads(model.gguf) if h.read_per_token]
        stored = f"the file's {gguf_blocks} blocks" + (f" and its {head[0]} LM head" if head else "")
        held = held_as(model.gguf)
        stored += f" as ggml holds them ({'; '.join(held)})" if held else " as stored"
    if reads is None:
        return ()
    kept = bf16_projections and reads.projection_elements > 0 and BYTES[dtype] != BYTES["bfloat16"]
    total = reads.bytes_in(BYTES[dtype], BYTES["bfloat16"] if kept else None)
    blocks = kernel_blocks if reads.quantized_weights else None
    if blocks:
        name, block_bytes = blocks
        total = reads.bytes_as_blocks(BYTES[dtype], block_bytes, BYTES["bfloat16"] if kept else None)
        floats = reads.float_elements - reads.quantized_float_elements
        parts = [
            f"{reads.quantized_weights / 1e6:.1f} M quantized weights as {name} holds them ({block_bytes} bytes per 32 "
            f"weights, scales included)",
            *([_kept_projections(reads.projection_elements)] if kept else []),
            f"{(floats - (reads.projection_elements if kept else 0)) / 1e6:.1f} M other float values in {dtype}",
        ]
        if others := reads.packed_bytes - reads.quantized_packed_bytes:
            parts.append(f"{others / 1e6:.1f} MB of other integer tensors as stored")
    elif kept:
        others = reads.float_elements - reads.projection_elements
        parts = [f"{_kept_projections(reads.projection_elements)}, {others / 1e6:.1f} M other float values in {dtype}"]
    else:
        parts = [f"{reads.float_elements / 1e6:.1f} M float values (layers, scales) in {dtype}"]
    if reads.packed_bytes and not blocks:
        parts.insert(0, f"{reads.packed_bytes / 1e6:.1f} MB of {stored}")
    why = (
        f"one decode step reads {total / 1e6:.1f} MB of weights: {', '.join(parts)}; the input embedding table only "
        "where it is also the LM head (a step gathers one row of it); from the checkpoint's tensor headers"
    )
    return (record("model", "read_per_token", total, why, "policy"),)


def _kept_projections(elements: int) -> str:
    return (
        f"{elements / 1e6:.1f} M projection weights kept in bfloat16 by the service's kernel "
        "(if their values are bf16, as it checks at load)"
    )


def _citing_reads(result: PolicyResult, reads: tuple[Decision, ...]) -> PolicyResult:
    """The kernel decision says how many bytes per token its kernel reads."""
    if not reads:
        return result
    cite = f"; reads {reads[0].value / 1e6:.1f} MB of weights per decode token (model.read_per_token)"
    return replace(
        result,
        decisions=tuple(
            replace(d, reason=d.reason + cite) if d.setting == "quant.linear_kernel" else d for d in result.decisions
        ),
    )


def _backend_question(
    model: ModelFacts,
    backend: BackendChoice,
    backend_decided: PolicyResult,
    dense_env: Mapping[str, str],  # what the backend's own dense linear kernel reads (the service's bf16 kernel)
    dtype: str,
    lowered: Callable[[str], EnginePlan],
) -> tuple[Question, ...]:
    """The backend's own kernels (zentorch on Zen) or vLLM's generic ones for an unquantized model's linear layers,
    where the backend chose itself and has a lowering: each candidate times what its backend's engine would run,
    the lowering in a process started with that backend's environment (platform, preloads, OpenMP runtime)."""
    entry = backend.entry
    if entry is None or backend.requested != "auto" or model.quant is not None or not model.linear_shapes:
        return ()
    own = {d.name: str(d.value) for d in backend_decided.decisions if d.name == PREPACK_ENV} | dict(dense_env)
    candidates = [Candidate(entry.name, {"backend": entry.name}, entry.name, own)]
    for name in entry.lowers_to:
        plan = lowered(name)
        if plan.ok:
            kernels = {k: v for k, v in plan.env.items() if k == KERNELS_ENV}
            candidates.append(Candidate(name, {"backend": name}, name, kernels, process_env=plan.env))
    if len(candidates) < 2:
        return ()
    return (backend_question(entry.name, tuple(candidates), model.linear_shapes, dtype),)


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


def _calibrated(result: PolicyResult, verdict: Verdict | None, user: frozenset[str]) -> PolicyResult:
    """The backend's own decisions, with zentorch's prepack as the calibration chose it (never over the user)."""
    if verdict is None or not verdict.settings or "zentorch_weight_prepack" in user:
        return result
    value = "1" if verdict.settings["zentorch_weight_prepack"] else "0"
    why = f"calibrated on this machine ({verdict.chosen}; calibration.zentorch_weight_prepack)"
    return PolicyResult(
        tuple(env(PREPACK_ENV, value, why, "calibration") if d.name == PREPACK_ENV else d for d in result.decisions),
        result.warnings,
        result.errors,
    )


def _in_dtype(model: ModelFacts, dtype: str, kept_blocks: str | None = None) -> ModelFacts:
    """The model as the engine holds it: unquantized weights are cast to the engine dtype at load; a GGUF file's
    kept blocks (`kept_blocks`) stay as the file stores them."""
    if kept_blocks and model.gguf is not None:
        return replace(model, weight_bytes=converted_bytes(model.gguf, dtype, kept_blocks))
    stored = BYTES.get(model.declared_dtype or "")
    if model.quant is not None or stored is None or stored == BYTES[dtype]:
        return model
    return replace(model, weight_bytes=model.weight_bytes * BYTES[dtype] // stored)


def _fits(hardware: HardwareFacts, model: ModelFacts, settings: Settings, threads: ThreadPlan) -> bool:
    """Weights, headroom and one request of the model's own context fit the memory limit and each rank's NUMA node
    (or they are unknown)."""
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


def _cache_decisions(
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


def _kv_decision(
    hardware: HardwareFacts,
    model: ModelFacts,
    dtype: str,
    max_len: int,
    threads: ThreadPlan,
    settings: Settings,
    user: frozenset[str],
    environ: Mapping[str, str],
) -> PolicyResult:
    source: Source = "user" if "kv_cache_dtype" in user else "default"
    stored, value_bytes = plan_kv_cache_dtype(hardware.cpu.isa, model, settings.kv_cache_dtype, dtype, source)
    if not stored.ok:
        return stored
    legacy = environ.get("VLLM_CPU_KVCACHE_SPACE")
    if legacy:
        return stored + PolicyResult.of(
            record("env", "VLLM_CPU_KVCACHE_SPACE", legacy, "set in the environment; vLLM lets it override", "user")
        )
    plan = plan_memory(
        hardware.limits,
        model,
        dtype_bytes=value_bytes,
        max_model_len=max_len,
        tp_size=threads.tp_size,
        max_num_seqs=settings.max_num_seqs,
        kv_cache_gib=settings.kv_cache_gib,
        headroom_gib=settings.memory_headroom_gib,
        lora_bytes=lora_slot_bytes(model, BYTES[dtype], _lora_runtime(model, settings)),
        rank_memory=rank_nodes(threads.ranks, hardware.topology.nodes, hardware.node_memory),
    )
    if plan.error:
        return stored + PolicyResult(errors=(plan.error,))
    return stored + PolicyResult.of(engine("kv_cache_memory_bytes", plan.kv_cache_bytes, plan.reason, plan.source))


def _lora_runtime(model: ModelFacts, settings: Settings) -> LoraRuntime | None:
    return lora_runtime(settings.lora_dir, settings.lora_max_rank, model.lora_adapters)


def _general_decisions(settings: Settings, user: frozenset[str], lora: bool) -> PolicyResult:
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
