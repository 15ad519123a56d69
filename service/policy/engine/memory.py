"""KV cache size from the memory limit and what of it is free at start, and the pre-flight check that a max-length
request fits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from service.facts.limits import Limits
from service.facts.model import ModelFacts
from service.facts.node_memory import NodeMemory
from service.policy.engine.kv_reads import sessions_at_depth
from service.policy.plan.decision import Source

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


def rank_nodes(
    ranks: Sequence[Sequence[int]], node_cpus: Mapping[int, frozenset[int]], memory: Mapping[int, NodeMemory]
) -> tuple[tuple[int, NodeMemory], ...]:
    """The NUMA node (id, memory) each rank's worker binds its memory to: the node of its first CPU, as vLLM's CPU
    worker picks it. Empty where a rank's node or its meminfo is not known."""
    node_of = {cpu: node for node, cpus in node_cpus.items() for cpu in cpus}
    nodes = [node_of.get(min(rank)) if rank else None for rank in ranks]
    if not nodes or any(node is None or node not in memory for node in nodes):
        return ()
    return tuple((node, memory[node]) for node in nodes if node is not None)


@dataclass(frozen=True)
class _Room:
    """Bytes the KV cache of all ranks together may take, and how that was reached."""

    kv_bytes: int
    needs: str  # what is subtracted, e.g. "weights 0.50 GiB + headroom 4.18 GiB"
    needed: int  # its bytes
    where: str  # what it is subtracted from
    share: float = 1.0  # the part of the whole KV cache that lives there (a node holding 1 of 2 ranks: 0.5)
    holds: str = ""  # whose KV cache that part is, where it is not the whole

    def part(self, kv_bytes: int) -> int:
        return int(kv_bytes * self.share)


def _node_room(
    rank_memory: Sequence[tuple[int, NodeMemory]],
    fixed_per_rank: int,
    headroom_gib: float | None,
    tp_size: int,
    weights: str,
) -> _Room | None:
    """The tightest rank's NUMA node: it holds its ranks' weights, the headroom (the user's, else the default for
    the node's size) and their KV caches. vLLM's worker refuses a KV cache larger than what the node's meminfo
    shows available (service/facts/node_memory.py)."""
    per_node = Counter(node for node, _ in rank_memory)
    rooms = []
    for node, memory in dict(rank_memory).items():
        ranks = per_node[node]
        headroom = int(headroom_gib * GiB) if headroom_gib is not None else default_headroom(memory.total_bytes)
        per_rank = (memory.usable_bytes - headroom - ranks * fixed_per_rank) // ranks
        shown = (
            f"{gib(memory.total_bytes)}"
            if memory.available_bytes is None
            else f"{gib(memory.available_bytes)} available of {gib(memory.total_bytes)}"
        )
        held = f"{ranks} ranks' " if ranks > 1 else ""
        needs = f"{held}{weights}{' per rank' if tp_size > 1 else ''} + headroom {gib(headroom)}"
        where = f"NUMA node {node}'s meminfo, which vLLM's worker checks its KV cache against, shows {shown}"
        holds = f" for the KV caches of {ranks} of {tp_size} ranks" if ranks < tp_size else ""
        needed = ranks * fixed_per_rank + headroom
        rooms.append(_Room(per_rank * tp_size, needs, needed, where, ranks / tp_size, holds))
    return min(rooms, key=lambda room: room.kv_bytes, default=None)


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
    rank_memory: Sequence[tuple[int, NodeMemory]] = (),
) -> MemoryPlan:
    """`lora_bytes`: what vLLM allocates for LoRA adapter slots at start (service/policy/engine/lora.py), held beside the
    weights. `rank_memory`: the NUMA node each rank binds to (rank_nodes); () when not known."""
    limit = limits.memory_bytes
    headroom = int(headroom_gib * GiB) if headroom_gib is not None else default_headroom(limit or 0)
    per_token = model.kv_bytes_per_token(dtype_bytes)
    one_request = per_token * (max_model_len + KV_SPARE_TOKENS)
    if limit is None:
        kv = int(kv_cache_gib * GiB) if kv_cache_gib else None
        why = "memory limit unknown: " + ("KV cache size set by the user" if kv else "KV cache size left to vLLM")
        return MemoryPlan(kv // tp_size if kv else None, why, "user" if kv else "default", headroom)

    room, machine_where = _room(limits, limit, model, lora_bytes, headroom, headroom_gib, tp_size, rank_memory)
    if (error := _no_room(room, per_token, one_request, max_model_len)) is not None:
        return MemoryPlan(None, error, "policy", headroom, error=error)
    if kv_cache_gib is not None:
        return _users_kv_cache(kv_cache_gib, room, one_request, max_model_len, machine_where, tp_size, headroom)
    budget = room.kv_bytes
    seqs = max_num_seqs or DEFAULT_MAX_SEQS
    useful = per_token * (max_model_len * seqs + KV_SPARE_TOKENS)
    kv = min(budget, useful) if useful else budget
    reason = (
        f"{room.where} - {room.needs.replace(' + ', ' - ')} = {gib(room.part(budget))} available{room.holds}"
        + (f"; capped at {seqs} max-length sequences ({gib(useful)})" if useful and useful < budget else "")
        + (f"; split over {tp_size} ranks" if tp_size > 1 else "")
        + f"; holds {kv // per_token if per_token else 'any number of'} tokens"
        + (f" ({sessions_at_depth(kv // per_token, max_model_len, seqs)})" if per_token else "")
    )
    if room.where != machine_where:  # a NUMA node's room is the tighter one
        reason += f" (the machine's {machine_where})"
    return MemoryPlan(kv // tp_size, reason, "policy", headroom)


def _room(
    limits: Limits,
    limit: int,
    model: ModelFacts,
    lora_bytes: int,
    headroom: int,
    headroom_gib: float | None,
    tp_size: int,
    rank_memory: Sequence[tuple[int, NodeMemory]],
) -> tuple[_Room, str]:
    """What is left for the KV cache: of the machine's (or the cgroup's) memory, or of a rank's NUMA node where that
    is tighter; and how the machine's limit reads."""
    where = f"limit is {gib(limit)} ({limits.memory_source})"
    free = limits.memory_available_bytes
    if free is not None and free < limit:
        # Memory other processes hold is not ours: vLLM refuses a KV cache larger than what is free when it
        # allocates, so the budget is what is free now.
        where += f", {gib(free)} of it free at start (MemAvailable / the cgroup's memory.current)"
        limit = free
    fixed = model.weight_bytes + lora_bytes + headroom
    weights = f"weights {gib(model.weight_bytes)}" + (f" + LoRA slots {gib(lora_bytes)}" if lora_bytes else "")
    room = _Room(limit - fixed, f"{weights} + headroom {gib(headroom)}", fixed, where)
    per_rank_weights = (
        f"weights{' + LoRA slots' if lora_bytes else ''} {gib((model.weight_bytes + lora_bytes) // tp_size)}"
    )
    node = _node_room(
        rank_memory, (model.weight_bytes + lora_bytes) // tp_size, headroom_gib, tp_size, per_rank_weights
    )
    return (node if node is not None and node.kv_bytes < room.kv_bytes else room), where


def _no_room(room: _Room, per_token: int, one_request: int, max_model_len: int) -> str | None:
    """Why not even one request of the max context fits, or None."""
    if room.kv_bytes < 0:
        return (
            f"the model does not fit: {room.needs} = {gib(room.needed)}, {room.where}; "
            "even a context of 0 tokens does not fit"
        )
    if room.kv_bytes < one_request:
        fits = max(0, room.kv_bytes // per_token - KV_SPARE_TOKENS) if per_token else 0
        return (
            f"needs {gib(room.needed + room.part(one_request))} ({room.needs} + KV cache for one {max_model_len}-token "
            f"request {gib(room.part(one_request))}{room.holds}), {room.where}; a max context of {fits} tokens fits "
            "(set max_model_len)"
        )
    return None


def _users_kv_cache(
    kv_cache_gib: float, room: _Room, one_request: int, max_model_len: int, where: str, tp_size: int, headroom: int
) -> MemoryPlan:
    """The user's KV cache size, where it holds one request and fits."""
    kv = int(kv_cache_gib * GiB)
    if kv < one_request:
        error = (
            f"kv_cache_gib={kv_cache_gib:g} cannot hold one {max_model_len}-token request ({gib(one_request)} needed)"
        )
        return MemoryPlan(None, error, "user", headroom, error=error)
    if kv > room.kv_bytes:
        error = (
            f"kv_cache_gib={kv_cache_gib:g} ({gib(room.part(kv))}{room.holds}) + {room.needs} = "
            f"{gib(room.needed + room.part(kv))}, {room.where}"
        )
        return MemoryPlan(None, error, "user", headroom, error=error)
    return MemoryPlan(kv // tp_size, f"set by the user; {where}", "user", headroom)
