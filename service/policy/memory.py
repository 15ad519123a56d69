"""KV cache size from the memory limit and what of it is free at start, and the pre-flight check that a max-length
request fits."""

from __future__ import annotations

from dataclasses import dataclass

from service.facts.limits import Limits
from service.facts.model import ModelFacts
from service.policy.decision import Source

GiB = 1024**3
# Three processes (API server, engine core, worker) each import torch and vLLM (~1 GiB apiece), plus
# activations and allocator slack that grow with the machine.
BASE_HEADROOM = 3 * GiB
HEADROOM_FRACTION = 0.05
# vLLM's scheduler default; more KV than this many max-length sequences can never be used.
DEFAULT_MAX_SEQS = 256
# vLLM keeps one KV block out of use (CPU blocks hold 128 tokens): a cache of exactly one max-length request
# is refused ("estimated maximum model length is max - 128"). Two blocks of slack cover it.
KV_SPARE_TOKENS = 256


@dataclass(frozen=True)
class MemoryPlan:
    kv_cache_bytes: int | None  # per rank, for vLLM's kv_cache_memory_bytes; None: leave to vLLM
    reason: str
    source: Source
    headroom_bytes: int
    error: str | None = None


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def default_headroom(limit: int) -> int:
    return int(BASE_HEADROOM + HEADROOM_FRACTION * limit)


def plan_memory(
    limits: Limits,
    model: ModelFacts,
    *,
    dtype_bytes: int,
    max_model_len: int,
    tp_size: int,
    max_num_seqs: int | None,
    kv_cache_gib: float | None,
    headroom_gib: float | None,
    lora_bytes: int = 0,
) -> MemoryPlan:
    """`lora_bytes`: what vLLM allocates for LoRA adapter slots at start (service/policy/lora.py), held beside the
    weights."""
    limit = limits.memory_bytes
    headroom = int(headroom_gib * GiB) if headroom_gib is not None else default_headroom(limit or 0)
    per_token = model.kv_bytes_per_token(dtype_bytes)
    one_request = per_token * (max_model_len + KV_SPARE_TOKENS)
    if limit is None:
        kv = int(kv_cache_gib * GiB) if kv_cache_gib else None
        why = "memory limit unknown: " + ("KV cache size set by the user" if kv else "KV cache size left to vLLM")
        return MemoryPlan(kv // tp_size if kv else None, why, "user" if kv else "default", headroom)

    where = f"limit is {gib(limit)} ({limits.memory_source})"
    free = limits.memory_available_bytes
    if free is not None and free < limit:
        # Memory other processes hold is not ours: vLLM refuses a KV cache larger than what is free when it
        # allocates, so the budget is what is free now.
        where += f", {gib(free)} of it free at start (MemAvailable / the cgroup's memory.current)"
        limit = free
    fixed = model.weight_bytes + lora_bytes + headroom
    weights = f"weights {gib(model.weight_bytes)}" + (f" + LoRA slots {gib(lora_bytes)}" if lora_bytes else "")
    if fixed > limit:
        error = (
            f"the model does not fit: {weights} + headroom {gib(headroom)} "
            f"= {gib(fixed)}, {where}; even a context of 0 tokens does not fit"
        )
        return MemoryPlan(None, error, "policy", headroom, error=error)
    if fixed + one_request > limit:
        fits = max(0, (limit - fixed) // per_token - KV_SPARE_TOKENS) if per_token else 0
        error = (
            f"needs {gib(fixed + one_request)} ({weights} + KV cache for one "
            f"{max_model_len}-token request {gib(one_request)} + headroom {gib(headroom)}), {where}; "
            f"a max context of {fits} tokens fits (set max_model_len)"
        )
        return MemoryPlan(None, error, "policy", headroom, error=error)

    if kv_cache_gib is not None:
        kv = int(kv_cache_gib * GiB)
        if kv < one_request:
            error = (
                f"kv_cache_gib={kv_cache_gib:g} cannot hold one {max_model_len}-token request "
                f"({gib(one_request)} needed)"
            )
            return MemoryPlan(None, error, "user", headroom, error=error)
        if fixed + kv > limit:
            error = f"kv_cache_gib={kv_cache_gib:g} + weights + headroom = {gib(fixed + kv)}, {where}"
            return MemoryPlan(None, error, "user", headroom, error=error)
        return MemoryPlan(kv // tp_size, f"set by the user; {where}", "user", headroom)

    budget = limit - fixed
    seqs = max_num_seqs or DEFAULT_MAX_SEQS
    useful = per_token * (max_model_len * seqs + KV_SPARE_TOKENS)
    kv = min(budget, useful) if useful else budget
    reason = (
        f"{where} - {weights.replace(' + ', ' - ')} - headroom {gib(headroom)} = {gib(budget)} available"
        + (f"; capped at {seqs} max-length sequences ({gib(useful)})" if useful and useful < budget else "")
        + (f"; split over {tp_size} ranks" if tp_size > 1 else "")
        + f"; holds {kv // per_token if per_token else 'any number of'} tokens"
    )
    return MemoryPlan(kv // tp_size, reason, "policy", headroom)
