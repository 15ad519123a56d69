"""The KV cache: its dtype (policy/engine/kv_cache_dtype.py) and the memory it gets (policy/engine/memory.py), or the user's legacy
VLLM_CPU_KVCACHE_SPACE."""

from __future__ import annotations

from collections.abc import Mapping

from service.facts.hardware import HardwareFacts
from service.facts.model import ModelFacts
from service.policy.engine.dtype import BYTES
from service.policy.engine.kv_cache_dtype import plan_kv_cache_dtype
from service.policy.engine.kv_reads import kv_read_per_token
from service.policy.engine.lora import LoraRuntime, lora_runtime, lora_slot_bytes
from service.policy.engine.memory import plan_memory, rank_nodes
from service.policy.machine.threads import ThreadPlan
from service.policy.plan.decision import PolicyResult, Source, engine, record
from service.settings import Settings


def kv_cache_decision(
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
        lora_bytes=lora_slot_bytes(model, BYTES[dtype], model_lora_runtime(model, settings)),
        rank_memory=rank_nodes(threads.ranks, hardware.topology.nodes, hardware.node_memory),
    )
    if plan.error:
        return stored + PolicyResult(errors=(plan.error,))
    reads = PolicyResult(decisions=kv_read_per_token(model, value_bytes, max_len))
    return (
        stored + PolicyResult.of(engine("kv_cache_memory_bytes", plan.kv_cache_bytes, plan.reason, plan.source)) + reads
    )


def model_lora_runtime(model: ModelFacts, settings: Settings) -> LoraRuntime | None:
    return lora_runtime(settings.lora_dir, settings.lora_max_rank, model.lora_adapters)
