"""The CPUs of a model table's engines: shared (each engine binds every allowed CPU, as it would alone) or split (each
engine loaded at once gets cores of its own, a slot), chosen from the measurement of two engines decoding at once
(`python -m bench.tools.table_cpus`, rows `table-cpus/...` of the measurement store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from service.facts.cpulist import format_cpulist
from service.facts.limits import Limits
from service.facts.topology import Topology
from service.in_vllm.contract import THREADS_BIND_ENV
from service.measurements.store import Row, cite, row
from service.policy.plan.decision import Decision, Source, record

CpuMode = Literal["auto", "shared", "split"]
# Two engines of one file decoding one stream each at once, then one alone beside the other idle: split against shared
# (bench/tools/table_cpus.py). The rule rests on the first; the second is what split costs an engine that computes alone.
TOGETHER = "table-cpus/xeon-amx/1.5b-q4_0-gguf/together"
ALONE = "table-cpus/xeon-amx/1.5b-q4_0-gguf/alone"


@dataclass(frozen=True)
class CpuPlan:
    mode: str  # "all" (one engine at once), "shared" or "split"
    slots: tuple[tuple[int, ...], ...]  # split: the CPUs each engine loaded at once is started on; else ()
    decision: Decision
    error: str | None = None


def split_slots(topology: Topology, limits: Limits, engines: int) -> tuple[tuple[int, ...], ...] | None:
    """The allowed cores cut into `engines` slots of whole cores (SMT siblings together), contiguous in node order,
    so that a slot stays on one NUMA node where the engines divide the nodes. Each engine's own plan then keeps its
    reserved CPUs for its API server inside its slot, as one engine does on the machine. None: fewer cores than
    engines."""
    allowed = limits.allowed_cpus & topology.online_cpus
    cores = [
        usable for c in sorted(topology.cores, key=lambda c: (c.node, c.cpus)) if (usable := set(c.cpus) & allowed)
    ]
    if len(cores) < engines:
        return None
    size, extra = divmod(len(cores), engines)
    slots, start = [], 0
    for i in range(engines):
        end = start + size + (i < extra)
        slots.append(tuple(sorted(set().union(*cores[start:end]))))
        start = end
    return tuple(slots)


def plan_table_cpus(
    setting: CpuMode, source: Source, topology: Topology, limits: Limits, engines: int, user_bind: str | None = None
) -> CpuPlan:
    """`user_bind`: VLLM_CPU_OMP_THREADS_BIND as the user set it, which every engine of the table inherits."""
    if engines <= 1:
        return CpuPlan(
            "all", (), record("model", "cpus", "all", "one engine loaded at once: every allowed CPU", "policy")
        )
    if user_bind:
        if setting == "split":
            error = (
                f"model_cpus=split and {THREADS_BIND_ENV}={user_bind} are both set: every engine would bind the user's CPU "
                f"lists, not a slot of its own (unset one)"
            )
            return CpuPlan("split", (), record("model", "cpus", "split", error, source), error)
        why = f"shared: {THREADS_BIND_ENV}={user_bind}, set by the user, binds every engine's threads to those CPUs"
        return CpuPlan("shared", (), record("model", "cpus", "shared", why, "user"))
    slots = split_slots(topology, limits, engines)
    if setting == "shared":
        why = f"shared: each of the {engines} engines binds every allowed CPU, as it would alone; set by the user"
        return CpuPlan("shared", (), record("model", "cpus", "shared", why, source))
    chosen = "set by the user"
    if setting == "auto":
        measured = f"two engines decoding at once, split against shared: {cite(TOGETHER)}; one alone: {cite(ALONE)}"
        if slots is None or not _pays(row(TOGETHER)):
            why = (
                f"shared: each of the {engines} engines binds every allowed CPU, as it would alone; "
                f"{_why_shared(slots, engines)}; {measured}"
            )
            return CpuPlan("shared", (), record("model", "cpus", "shared", why, source))
        chosen = f"chosen by the measurement: {measured}"
    if slots is None:
        error = (
            f"model_cpus=split: {engines} engines loaded at once but {_cores(topology, limits)} allowed core(s); "
            "a split needs a core per engine (lower max_loaded_models or set model_cpus=shared)"
        )
        return CpuPlan("split", (), record("model", "cpus", "split", error, source), error)
    why = (
        f"split: the allowed cores cut into {engines} slots ({' | '.join(format_cpulist(s) for s in slots)}); a "
        "loaded engine takes a free slot and its own plan binds inside it, its reserved CPUs included (one core: "
        f"none to reserve, its API server shares it); {chosen}"
    )
    return CpuPlan("split", slots, record("model", "cpus", "split", why, source))


def _pays(r: Row) -> bool:
    """Split wins when its gain together is above 1 across its interval (its value, without one)."""
    low = r.interval[0] if r.interval else r.value
    return low is not None and low > 1


def _why_shared(slots: object, engines: int) -> str:
    if slots is None:
        return f"fewer allowed cores than the {engines} engines, so none can have its own"
    return "the measurement does not show split faster with two engines computing at once"


def _cores(topology: Topology, limits: Limits) -> int:
    allowed = limits.allowed_cpus & topology.online_cpus
    return sum(bool(set(c.cpus) & allowed) for c in topology.cores)
