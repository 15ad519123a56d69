"""CPU lists per tensor-parallel rank from the allowed CPUs, and the CPUs kept for the API server."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from service.facts.cpulist import CpuListError, format_cpulist, parse_cpulist
from service.facts.limits import Limits
from service.facts.topology import Topology
from service.in_vllm.contract import THREADS_BIND_ENV
from service.policy.plan.decision import Decision, PolicyResult, Source, engine, env, record


@dataclass(frozen=True)
class ThreadPlan:
    ranks: tuple[tuple[int, ...], ...]  # one CPU per physical core, per rank
    reserved: tuple[int, ...]  # kept free of engine threads
    tp_size: int
    tp_reason: str
    tp_source: Source
    reason: str
    warnings: tuple[str, ...] = ()
    error: str | None = None
    simulated_nodes: Decision | None = None  # topology.numa_nodes, when the nodes the ranks follow are simulated
    user_mode: str | None = None  # vLLM's own binding mode (auto, nobind), where the user set one
    bind_source: Source = "policy"

    @property
    def bind(self) -> str:
        """VLLM_CPU_OMP_THREADS_BIND form: one CPU list per rank, separated by '|'."""
        return self.user_mode or "|".join(format_cpulist(r) for r in self.ranks)


# vLLM's own modes: it then binds from its own reading of the machine, which ignores a container's cpuset.
VLLM_BIND_MODES = ("auto", "nobind")


def _cores_by_node(topology: Topology, allowed: frozenset[int]) -> dict[int, list[int]]:
    """For each NUMA node holding allowed CPUs: one allowed CPU per physical core (SMT siblings left out)."""
    by_node: dict[int, list[int]] = {}
    for core in topology.cores:
        usable = sorted(set(core.cpus) & allowed)
        if usable:
            by_node.setdefault(core.node, []).append(usable[0])
    return {node: sorted(cpus) for node, cpus in sorted(by_node.items())}


# vLLM (ompmultiprocessing.OMPProcessManager) asserts VLLM_CPU_OMP_THREADS_BIND=auto when this is set; the
# service always passes explicit bind lists, so the engine would fail at start.
VLLM_SIM_MULTI_NUMA = "VLLM_CPU_SIM_MULTI_NUMA"
SIM_MULTI_NUMA_ERROR = (
    f"{VLLM_SIM_MULTI_NUMA} is set: vLLM accepts it only with VLLM_CPU_OMP_THREADS_BIND=auto, and the service "
    "binds each rank explicitly; unset it and set SERVICE_SIMULATE_NUMA_NODES=N to simulate N NUMA nodes"
)


def _simulated_nodes(by_node: dict[int, list[int]], count: int) -> tuple[dict[int, list[int]], Decision]:
    """The allowed cores of the real nodes, in order, cut into `count` contiguous simulated nodes."""
    flat = [cpu for cpus in by_node.values() for cpu in cpus]
    nodes = {i: chunk for i, chunk in enumerate(_split(flat, count))}
    reason = (
        f"simulated: simulate_numa_nodes={count} cuts the {len(flat)} allowed physical core(s) of "
        f"{len(by_node)} real NUMA node(s) into {count} nodes "
        f"({' | '.join(format_cpulist(c) for c in nodes.values())}); memory is not split, every rank "
        "allocates from the real node(s)"
    )
    return nodes, record("topology", "numa_nodes", count, reason, "user")


def _split(cpus: list[int], parts: int) -> list[list[int]]:
    """Contiguous, nearly equal chunks (the first ones one larger when uneven)."""
    size, extra = divmod(len(cpus), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(cpus[start:end])
        start = end
    return out


def _assign_ranks(by_node: dict[int, list[int]], tp: int) -> tuple[list[list[int]], list[str]]:
    nodes = list(by_node)
    if tp <= len(nodes):
        warnings = []
        if tp < len(nodes):
            unused = ", ".join(str(n) for n in nodes[tp:])
            warnings.append(
                f"tensor_parallel_size={tp} uses {tp} of {len(nodes)} NUMA nodes: node(s) {unused} stay idle "
                "(one rank per node keeps each rank's memory local)"
            )
        return [by_node[n] for n in nodes[:tp]], warnings
    if tp % len(nodes) == 0:
        per = tp // len(nodes)
        return [chunk for n in nodes for chunk in _split(by_node[n], per)], []
    flat = [cpu for n in nodes for cpu in by_node[n]]
    return _split(flat, tp), [
        f"tensor_parallel_size={tp} is not a multiple of the {len(nodes)} NUMA nodes: some ranks span two nodes"
    ]


def _apply_quota(ranks: list[list[int]], budget: int) -> list[list[int]]:
    """Trim ranks evenly (from their ends) until the engine uses at most `budget` cores."""
    ranks = [list(r) for r in ranks]
    while sum(map(len, ranks)) > budget:
        longest = max(range(len(ranks)), key=lambda i: (len(ranks[i]), i))
        if len(ranks[longest]) <= 1:
            break
        ranks[longest].pop()
    return ranks


def _reserve(ranks: list[list[int]], spare: list[int], count: int) -> tuple[list[list[int]], list[int], list[str]]:
    """Reserve idle cores first (nothing lost), then the last cores of the last ranks, as vLLM's auto bind does."""
    reserved = spare[:count]
    ranks = [list(r) for r in ranks]
    warnings = []
    rank = len(ranks) - 1
    while len(reserved) < count:
        donors = [i for i in range(len(ranks)) if len(ranks[i]) > 1]
        if not donors:
            warnings.append(
                f"only {len(reserved)} of {count} reserved CPU(s) could be kept for the API server: "
                "every rank needs at least one core"
            )
            break
        if rank not in donors:
            rank = donors[-1]
        reserved.append(ranks[rank].pop())
        rank = (rank - 1) % len(ranks)
    return ranks, sorted(reserved), warnings


def plan_threads(
    topology: Topology,
    limits: Limits,
    tp_size: int | None,
    reserved_cpus: int,
    simulate_nodes: int | None = None,
    user_bind: str | None = None,
) -> ThreadPlan:
    """The policy's plan, or the bind lists the user set in VLLM_CPU_OMP_THREADS_BIND (`user_bind`): two instances
    on one host, say, each on its own cores. A list outside the allowed CPUs refuses the start."""
    plan = _policy_threads(topology, limits, tp_size, reserved_cpus, simulate_nodes)
    if not user_bind or plan.error:
        return plan
    if user_bind in VLLM_BIND_MODES:
        warning = (
            f"{THREADS_BIND_ENV}={user_bind} set by the user: vLLM binds by its own reading of the machine, which ignores a "
            f"container's cpuset; the service's plan would bind {plan.bind}"
        )
        return dataclasses.replace(plan, user_mode=user_bind, bind_source="user", warnings=(*plan.warnings, warning))
    return _user_threads(plan, user_bind, limits, tp_size, topology)


def _user_threads(plan: ThreadPlan, bind: str, limits: Limits, tp_size: int | None, topology: Topology) -> ThreadPlan:
    allowed = limits.allowed_cpus & topology.online_cpus
    try:
        ranks = [parse_cpulist(cpus) for cpus in bind.split("|")]
    except CpuListError as exc:
        return dataclasses.replace(plan, error=f"{THREADS_BIND_ENV} set by the user: {exc}")
    outside = set().union(*ranks) - allowed
    if not all(ranks) or outside:
        why = f"names CPU(s) {format_cpulist(outside)} outside" if outside else "has an empty rank list, not within"
        error = f"{THREADS_BIND_ENV}={bind} set by the user {why} the allowed CPUs {format_cpulist(allowed)}"
        return dataclasses.replace(plan, error=f"{error} ({limits.allowed_cpus_source})")
    if tp_size and tp_size != len(ranks):
        error = f"{THREADS_BIND_ENV}={bind} set by the user lists {len(ranks)} rank(s), tensor_parallel_size={tp_size}"
        return dataclasses.replace(plan, error=error)
    used = set().union(*ranks)
    return dataclasses.replace(
        plan,
        ranks=tuple(tuple(sorted(r)) for r in ranks),
        reserved=tuple(sorted(allowed - used)),
        tp_size=len(ranks),
        tp_reason=f"one rank per CPU list of {THREADS_BIND_ENV}, set by the user",
        tp_source="user",
        reason=f"set by the user ({THREADS_BIND_ENV}); the service's plan would bind {plan.bind}",
        bind_source="user",
        warnings=(),
    )


def _policy_threads(
    topology: Topology, limits: Limits, tp_size: int | None, reserved_cpus: int, simulate_nodes: int | None
) -> ThreadPlan:
    allowed = limits.allowed_cpus & topology.online_cpus
    by_node = _cores_by_node(topology, allowed)
    if not by_node:
        error = (
            f"no usable CPU: {limits.allowed_cpus_source} have no CPU in common "
            f"(online: {format_cpulist(topology.online_cpus)})"
        )
        return ThreadPlan((), (), tp_size or 1, error, "policy", error, error=error)
    simulated = None
    if simulate_nodes:
        cores = sum(map(len, by_node.values()))
        if simulate_nodes > cores:
            error = (
                f"simulate_numa_nodes={simulate_nodes} needs at least {simulate_nodes} physical cores; "
                f"{cores} are allowed"
            )
            return ThreadPlan((), (), tp_size or 1, error, "user", error, error=error)
        by_node, simulated = _simulated_nodes(by_node, simulate_nodes)

    nodes = len(by_node)
    tp = tp_size or nodes
    tp_source: Source = "user" if tp_size else "policy"
    tp_reason = (
        "set by the user"
        if tp_size
        else f"{nodes} {'simulated ' if simulated else ''}NUMA node(s) hold allowed CPUs "
        f"({', '.join(map(str, by_node))}): one rank per node"
    )
    cores = sum(map(len, by_node.values()))
    if tp > cores:
        error = f"tensor_parallel_size={tp} needs at least {tp} physical cores; {cores} are allowed"
        return ThreadPlan((), (), tp, tp_reason, tp_source, error, error=error)

    ranks, warnings = _assign_ranks(by_node, tp)
    if simulated:
        warnings.insert(
            0,
            f"NUMA nodes are simulated (simulate_numa_nodes={simulate_nodes}), for tests: no rank "
            "gets node-local memory",
        )
    notes = [f"{cores} physical core(s) on the allowed CPUs {format_cpulist(allowed)} ({limits.allowed_cpus_source})"]
    if any(len(c.cpus) > 1 for c in topology.cores):
        notes.append("one thread per physical core, SMT siblings left out")
    ranks, reserved, reserve_warnings = _quota_and_reserve(ranks, by_node, limits, tp, reserved_cpus, notes)
    return ThreadPlan(
        ranks=tuple(tuple(r) for r in ranks),
        reserved=tuple(reserved),
        tp_size=tp,
        tp_reason=tp_reason,
        tp_source=tp_source,
        reason="; ".join(notes),
        warnings=tuple(warnings + reserve_warnings),
        simulated_nodes=simulated,
    )


def worker_omp_env(plan: ThreadPlan, ld_preload: str) -> dict[str, list[str]]:
    """The OpenMP variables vLLM sets in each worker at spawn from the bind list (mirrors
    vllm.utils.ompmultiprocessing): per rank, chosen by which OpenMP runtime is preloaded."""
    lists = [[str(c) for c in r] for r in plan.ranks]
    if "libiomp" in ld_preload or "libomp" in ld_preload:
        return {"KMP_AFFINITY": [f"granularity=fine,explicit,proclist=[{','.join(c)}]" for c in lists]}
    if "libgomp" in ld_preload:
        return {"GOMP_CPU_AFFINITY": [" ".join(c) for c in lists]}
    return {"OMP_PLACES": ["{" + ",".join(c) + "}" for c in lists], "OMP_PROC_BIND": ["true" for _ in lists]}


def thread_decisions(threads: ThreadPlan, environ: Mapping[str, str]) -> PolicyResult:
    """The plan as vLLM gets it: tensor-parallel size, bind lists, reserved CPUs; per rank, the OpenMP variables
    vLLM sets in each worker (after the runtime in `environ`'s LD_PRELOAD, the one the workers will load)."""
    if threads.error:
        return PolicyResult(warnings=threads.warnings, errors=(threads.error,))
    errors = [SIM_MULTI_NUMA_ERROR] if environ.get(VLLM_SIM_MULTI_NUMA, "0") != "0" else []
    decisions = [
        threads.simulated_nodes,
        engine("tensor_parallel_size", threads.tp_size, threads.tp_reason, threads.tp_source),
        env(THREADS_BIND_ENV, threads.bind, threads.reason, threads.bind_source),
        env(
            "VLLM_CPU_NUM_OF_RESERVED_CPU",
            str(len(threads.reserved)),
            "CPUs left out of the bind lists for the API server and engine core",
            "policy",
        ),
    ]
    for name, per_rank in worker_omp_env(threads, environ.get("LD_PRELOAD", "")).items():
        decisions.append(
            record(
                "worker_env",
                name,
                per_rank,
                "per rank, set by vLLM in each worker at spawn from VLLM_CPU_OMP_THREADS_BIND, before OpenMP starts "
                "(avoids the >16-thread affinity hang); not set in the API server process, where OpenMP would pin "
                "the server and every process it spawns to one compute core",
                "policy",
            )
        )
    return PolicyResult.of(*decisions, warnings=threads.warnings, errors=errors)


def _quota_and_reserve(
    ranks: list[list[int]],
    by_node: dict[int, list[int]],
    limits: Limits,
    tp: int,
    reserved_cpus: int,
    notes: list[str],
) -> tuple[list[list[int]], list[int], list[str]]:
    """The ranks cut to the CPU quota, and the CPUs kept for the API server and engine core (noted in `notes`)."""
    if limits.cpu_quota is not None:
        budget = max(tp, math.floor(limits.cpu_quota) - reserved_cpus)
        trimmed = _apply_quota(ranks, budget)
        if trimmed != ranks:
            notes.append(f"CPU quota of {limits.cpu_quota:g} CPUs: engine threads cut to {budget}")
        ranks = trimmed
    used = {cpu for r in ranks for cpu in r}
    spare = [cpu for node_cpus in by_node.values() for cpu in node_cpus if cpu not in used]
    ranks, reserved, reserve_warnings = _reserve(ranks, spare, reserved_cpus)
    if reserved:
        notes.append(f"CPU(s) {format_cpulist(reserved)} kept for the API server and engine core")
    return ranks, reserved, reserve_warnings
