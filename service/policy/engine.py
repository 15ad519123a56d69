"""Engine arguments and environment for vLLM: a pure function of (hardware, model, software, settings, env).

Plays for the service the role `CpuPlatform.check_and_update_config` plays inside vLLM, and says why for each
change. Every decision carries (setting, value, reason, source).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from service.facts.hardware import HardwareFacts
from service.facts.libraries import LibraryFacts
from service.facts.model import ModelFacts
from service.facts.software import SoftwareFacts
from service.facts.vllm_source import VllmNames
from service.policy.backend import BackendChoice, choose_backend
from service.policy.chat import chat_decisions, unknown_parser_errors
from service.policy.compile_cache import plan_compile_cache
from service.policy.decision import Decision, Source
from service.policy.dtype import BYTES, choose_dtype
from service.policy.kernels import check_kernels, dtype_limit
from service.policy.memory import plan_memory
from service.policy.model_source import ModelSourcePlan, plan_model_source
from service.policy.platform import choose_platform
from service.policy.preload import choose_preload
from service.policy.quant import plan_quant
from service.policy.threads import SIM_MULTI_NUMA_ERROR, VLLM_SIM_MULTI_NUMA, ThreadPlan, plan_threads, worker_omp_env
from service.settings import Settings

GDN_AMX_REASON = (
    "Gated-DeltaNet (linear-attention) model on AMX: the AMX GDN kernels keep one recurrent state per sequence, "
    "which prefix-cache hits and chunked prefill would resume mid-sequence (vLLM v0.23 turned both off here; "
    "v0.24 dropped that guard)"
)


FALLBACK_MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class EnginePlan:
    backend: BackendChoice
    threads: ThreadPlan | None
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...]
    errors: tuple[str, ...]
    engine_args: dict[str, Any] = field(default_factory=dict)  # kwargs for vLLM's AsyncEngineArgs
    env: dict[str, str] = field(default_factory=dict)  # set in this process before vLLM starts
    model: ModelSourcePlan | None = None  # what the engine loads, under which name (None: no model)


class _Builder:
    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.warnings: list[str] = []
        self.errors: list[str] = []
        self.engine_args: dict[str, Any] = {}
        self.env: dict[str, str] = {}

    def engine(self, name: str, value: Any, reason: str, source: Source) -> None:
        self.decisions.append(Decision(f"engine.{name}", value, reason, source))
        if value is not None:
            self.engine_args[name] = value

    def setenv(self, name: str, value: str, reason: str, source: Source) -> None:
        self.decisions.append(Decision(f"env.{name}", value, reason, source))
        self.env[name] = value

    def note(self, setting: str, value: Any, reason: str, source: Source) -> None:
        """A decision that vLLM applies itself (recorded so the user sees it, nothing to set here)."""
        self.decisions.append(Decision(setting, value, reason, source))


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
) -> EnginePlan:
    b = _Builder()
    user = settings.explicitly_set()
    backend = choose_backend(hardware.cpu, software, settings.backend)
    if backend.error:
        b.errors.append(backend.error)
        return EnginePlan(backend, None, tuple(b.decisions), tuple(b.warnings), tuple(b.errors))

    platform = choose_platform(backend, environ)
    b.decisions.extend(platform.decisions)
    b.env.update(platform.env)
    b.warnings.extend(platform.warnings)
    if libraries is not None:
        preload = choose_preload(backend.name, libraries, environ)
        b.decisions.append(preload.decision)
        b.env.update(preload.env)
        b.warnings.extend(preload.warnings)
    threads = plan_threads(
        hardware.topology,
        hardware.limits,
        settings.tensor_parallel_size,
        settings.reserved_cpus,
        settings.simulate_numa_nodes,
    )
    # The workers' OpenMP variables follow the runtime that will be preloaded, not this process's.
    _thread_decisions(b, threads, {**environ, **b.env})
    _zen_decisions(b, backend.name, settings, user)
    source: ModelSourcePlan | None = None
    if model is not None:
        _model_decisions(b, hardware, model, backend.name, settings, user, environ, threads.tp_size, default_model)
        source = plan_model_source(
            model,
            b.engine_args["dtype"],
            settings.cache_dir,
            software,
            vllm_names.text_generation_architectures if vllm_names else frozenset(),
            settings.served_model_name,
            known_as,
        )
        b.decisions.extend(source.decisions)
        b.errors.extend(source.errors)
        kernels = check_kernels(model, backend.name or "", b.engine_args["dtype"], hardware.cpu.isa)
        b.decisions.extend([kernels.decision] if kernels.decision else [])
        b.errors.extend(kernels.errors)
        known_methods = vllm_names.quantization_methods if vllm_names else None
        quant = plan_quant(model.quant, backend.name, b.engine_args.get("dtype"), settings, environ, known_methods)
        b.decisions.extend(quant.decisions)
        b.env.update(quant.env)
        b.warnings.extend(quant.warnings)
        b.errors.extend(quant.errors)
    _general_decisions(b, settings, user)
    compile_cache = plan_compile_cache(settings.cache_dir, software.vllm, environ)
    b.decisions.extend(compile_cache.decisions)
    b.env.update(compile_cache.env)
    return EnginePlan(
        backend, threads, tuple(b.decisions), tuple(b.warnings), tuple(b.errors), b.engine_args, b.env, source
    )


def _thread_decisions(b: _Builder, threads: ThreadPlan, environ: Mapping[str, str]) -> None:
    b.warnings.extend(threads.warnings)
    if threads.error:
        b.errors.append(threads.error)
        return
    if environ.get(VLLM_SIM_MULTI_NUMA, "0") != "0":
        b.errors.append(SIM_MULTI_NUMA_ERROR)
    if threads.simulated_nodes:
        b.decisions.append(threads.simulated_nodes)
    b.engine("tensor_parallel_size", threads.tp_size, threads.tp_reason, threads.tp_source)
    b.setenv("VLLM_CPU_OMP_THREADS_BIND", threads.bind, threads.reason, "policy")
    b.setenv(
        "VLLM_CPU_NUM_OF_RESERVED_CPU",
        str(len(threads.reserved)),
        "CPUs left out of the bind lists for the API server and engine core",
        "policy",
    )
    for name, per_rank in worker_omp_env(threads, environ.get("LD_PRELOAD", "")).items():
        b.note(
            f"worker_env.{name}",
            per_rank,
            "per rank, set by vLLM in each worker at spawn from VLLM_CPU_OMP_THREADS_BIND, before OpenMP starts "
            "(avoids the >16-thread affinity hang); not set in the API server process, where OpenMP would pin "
            "the server and every process it spawns to one compute core",
            "policy",
        )


def _zen_decisions(b: _Builder, backend: str | None, settings: Settings, user: frozenset[str]) -> None:
    if backend != "zen":
        return
    source: Source = "user" if "zentorch_weight_prepack" in user else "default"
    value = "1" if settings.zentorch_weight_prepack else "0"
    why = "zentorch prepacks linear weights once at load into its blocked layout (faster GEMMs, slower load)"
    b.setenv("VLLM_ZENTORCH_WEIGHT_PREPACK", value, why if value == "1" else "turned off by the user", source)


def _model_decisions(
    b: _Builder,
    hardware: HardwareFacts,
    model: ModelFacts,
    backend: str | None,
    settings: Settings,
    user: frozenset[str],
    environ: Mapping[str, str],
    tp_size: int,
    default_model: bool,
) -> None:
    isa = hardware.cpu.isa
    fp32_blocked = dtype_limit(model, backend or "", "float32") or (
        None if _fits(hardware, _in_dtype(model, "float32"), settings) else "the model's fp32 weights do not fit"
    )
    dtype = choose_dtype(isa, backend or "", settings.dtype, model.declared_dtype, fp32_blocked, default_model)
    b.engine("dtype", dtype.value, dtype.reason, dtype.source)
    if dtype.warning:
        b.warnings.append(dtype.warning)

    len_source: Source
    if settings.max_model_len:
        max_len, len_reason, len_source = settings.max_model_len, "set by the user", "user"
    elif model.max_context:
        max_len, len_reason, len_source = model.max_context, "the model's max_position_embeddings", "default"
    else:
        max_len, len_source = FALLBACK_MAX_MODEL_LEN, "policy"
        len_reason = f"the model's config declares no max context: {FALLBACK_MAX_MODEL_LEN} tokens"
    b.engine("max_model_len", max_len, len_reason, len_source)
    if model.max_context and max_len > model.max_context:
        b.warnings.append(
            f"max_model_len {max_len} is past the model's max_position_embeddings ({model.max_context}): vLLM starts "
            "only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and a request past that position is outside the model's "
            "rotary table (with torch.compile the worker aborted there: 'index out of bounds', engine dead)"
        )

    _cache_decisions(b, model, backend, settings, user, environ)
    _kv_decision(b, hardware, _in_dtype(model, dtype.value), dtype.value, max_len, tp_size, settings, environ)
    b.errors.extend(unknown_parser_errors(settings))
    for chat in chat_decisions(model, settings):  # tool-call and reasoning parsers
        b.engine(chat.setting.removeprefix("engine."), chat.value, chat.reason, chat.source)
    if model.quantization == "fp8":
        b.warnings.append("fp8 checkpoints have no CPU kernels in vLLM 0.32 on most CPUs; expect a load error")


def _in_dtype(model: ModelFacts, dtype: str) -> ModelFacts:
    """The model as the engine holds it: unquantized weights are cast to the engine dtype at load."""
    stored = BYTES.get(model.declared_dtype or "")
    if model.quant is not None or model.quantization or stored is None or stored == BYTES[dtype]:
        return model
    return replace(model, weight_bytes=model.weight_bytes * BYTES[dtype] // stored)


def _fits(hardware: HardwareFacts, model: ModelFacts, settings: Settings) -> bool:
    """Weights, headroom and one request of the model's own context fit the memory limit (or it is unknown)."""
    plan = plan_memory(
        hardware.limits,
        model,
        dtype_bytes=BYTES["float32"],
        max_model_len=settings.max_model_len or model.max_context or FALLBACK_MAX_MODEL_LEN,
        tp_size=1,
        max_num_seqs=settings.max_num_seqs,
        kv_cache_gib=None,
        headroom_gib=settings.memory_headroom_gib,
    )
    return plan.error is None


def _cache_decisions(
    b: _Builder,
    model: ModelFacts,
    backend: str | None,
    settings: Settings,
    user: frozenset[str],
    environ: Mapping[str, str],
) -> None:
    if model.is_embedding:
        for name in ("enable_prefix_caching", "enable_chunked_prefill"):
            b.engine(name, getattr(settings, name), "pooling model: left to vLLM", "default")
        return
    gdn_on_amx = backend == "amx" and model.has_linear_attention
    for name in ("enable_prefix_caching", "enable_chunked_prefill"):
        value = getattr(settings, name)
        if name in user and value is not None:
            if gdn_on_amx and value:
                b.warnings.append(f"{name}=true set by the user on a GDN model on AMX; policy would turn it off")
            b.engine(name, value, "set by the user", "user")
        elif gdn_on_amx:
            b.engine(name, False, GDN_AMX_REASON, "policy")
        elif model.uses_mla and backend != "amx":
            b.note(f"engine.{name}", False, "vLLM 0.32 turns it off for MLA models on CPUs without AMX", "policy")
        else:
            b.engine(name, True, "vLLM's default for generative models", "default")
    if gdn_on_amx:
        key = "VLLM_SSM_CONV_STATE_LAYOUT"
        if key in environ:
            b.note(f"env.{key}", environ[key], "already set in the environment", "user")
        else:
            b.setenv(key, "SD", "conv-state layout the AMX / AVX-512 BF16 GDN kernels read", "policy")


def _kv_decision(
    b: _Builder,
    hardware: HardwareFacts,
    model: ModelFacts,
    dtype: str,
    max_len: int,
    tp_size: int,
    settings: Settings,
    environ: Mapping[str, str],
) -> None:
    legacy = environ.get("VLLM_CPU_KVCACHE_SPACE")
    if legacy:
        b.note("env.VLLM_CPU_KVCACHE_SPACE", legacy, "set in the environment; vLLM lets it override", "user")
        return
    plan = plan_memory(
        hardware.limits,
        model,
        dtype_bytes=BYTES[dtype],
        max_model_len=max_len,
        tp_size=tp_size,
        max_num_seqs=settings.max_num_seqs,
        kv_cache_gib=settings.kv_cache_gib,
        headroom_gib=settings.memory_headroom_gib,
    )
    if plan.error:
        b.errors.append(plan.error)
        return
    b.engine("kv_cache_memory_bytes", plan.kv_cache_bytes, plan.reason, plan.source)


def _general_decisions(b: _Builder, settings: Settings, user: frozenset[str]) -> None:
    def src(name: str) -> Source:
        return "user" if name in user else "default"

    b.engine(
        "trust_remote_code",
        settings.trust_remote_code,
        "model code from the hub runs only when enabled explicitly",
        src("trust_remote_code"),
    )
    b.engine(
        "enforce_eager",
        settings.enforce_eager,
        "eager: faster start" if settings.enforce_eager else "torch.compile: slower start, faster decode",
        src("enforce_eager"),
    )
    if settings.max_num_seqs is not None:
        b.engine("max_num_seqs", settings.max_num_seqs, "set by the user", "user")
