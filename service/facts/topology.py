"""sysfs -> sockets, NUMA nodes and their CPU lists, physical cores vs SMT siblings."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from service.facts.cpu import CpuInfo, LogicalCpu
from service.facts.cpulist import format_cpulist
from service.facts.sysfs_value import cpu_list, whole_number


@dataclass(frozen=True)
class Core:
    """A physical core: its socket, NUMA node and the logical CPUs (SMT siblings) on it, sorted."""

    socket: int
    node: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    online_cpus: frozenset[int]
    sockets: int
    nodes: dict[int, frozenset[int]]  # NUMA node id -> its online CPUs
    cores: tuple[Core, ...]  # sorted by first CPU
    source: str  # "sysfs" | "cpuinfo"

    @property
    def smt(self) -> bool:
        return any(len(c.cpus) > 1 for c in self.cores)

    @property
    def cpu_nodes(self) -> dict[int, frozenset[int]]:
        """The NUMA nodes that have online CPUs (memory-only nodes, e.g. CXL or HBM, left out)."""
        return {node: cpus for node, cpus in self.nodes.items() if cpus}


def read_topology(sys_root: Path | None, cpuinfo: CpuInfo) -> Topology:
    """Topology from a /sys-like tree; from the cpuinfo fields when sys_root is None or lacks CPU topology."""
    if sys_root is not None and _has_cpu_topology(sys_root):
        return _from_sysfs(sys_root)
    return _from_cpuinfo(cpuinfo)


def _cpu_dir(sys_root: Path) -> Path:
    return sys_root / "devices" / "system" / "cpu"


def _has_cpu_topology(sys_root: Path) -> bool:
    cpu_dir = _cpu_dir(sys_root)
    return (cpu_dir / "online").is_file() and (cpu_dir / "cpu0" / "topology").is_dir()


def _read_cpulist(path: Path) -> frozenset[int]:
    return cpu_list(path, path.read_text())


def _from_sysfs(sys_root: Path) -> Topology:
    cpu_dir = _cpu_dir(sys_root)
    online = _read_cpulist(cpu_dir / "online")
    nodes = _sysfs_nodes(sys_root, online)
    node_of = {cpu: node for node, cpus in nodes.items() for cpu in cpus}
    packages: dict[int, int] = {}
    siblings: set[frozenset[int]] = set()
    for cpu in online:
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        package_file = topology / "physical_package_id"
        packages[cpu] = whole_number(package_file, package_file.read_text().strip())
        siblings.add(_siblings(topology) & online)
    cores = _sorted_cores(Core(packages[min(cpus)], node_of[min(cpus)], tuple(sorted(cpus))) for cpus in siblings)
    return Topology(
        online_cpus=online,
        sockets=len(set(packages.values())),
        nodes=nodes,
        cores=cores,
        source="sysfs",
    )


def _sorted_cores(cores: Iterable[Core]) -> tuple[Core, ...]:
    return tuple(sorted(cores, key=lambda core: core.cpus[0]))


def _siblings(topology: Path) -> frozenset[int]:
    # The kernel's own grouping of SMT threads; core_cpus_list is the newer name (Linux 5.4+).
    newer = topology / "core_cpus_list"
    return _read_cpulist(newer if newer.is_file() else topology / "thread_siblings_list")


def _sysfs_nodes(sys_root: Path, online: frozenset[int]) -> dict[int, frozenset[int]]:
    """NUMA node -> online CPUs; memory-only nodes keep an empty set; no node dirs -> one node 0."""
    node_root = sys_root / "devices" / "system" / "node"
    node_dirs = [d for d in node_root.glob("node*") if _NODE_DIR.fullmatch(d.name)]
    nodes = {int(d.name.removeprefix("node")): _read_cpulist(d / "cpulist") & online for d in node_dirs}
    if not nodes:
        return {0: online}
    # The kernel puts every online CPU in a node; a tree that does not is partial, and a CPU without a node
    # would get no thread binding.
    in_nodes = frozenset().union(*nodes.values())
    if homeless := online - in_nodes:
        raise ValueError(
            f"{node_root}: online CPU(s) {format_cpulist(homeless)} are in no NUMA node's cpulist "
            f"(the nodes hold {format_cpulist(in_nodes) or 'none'})"
        )
    return dict(sorted(nodes.items()))


_NODE_DIR = re.compile(r"node[0-9]+")


def _from_cpuinfo(cpuinfo: CpuInfo) -> Topology:
    """One NUMA node per socket; Arm cpuinfo has no socket/core fields: one core per processor, socket 0."""
    groups: dict[tuple[int, int | str], list[int]] = defaultdict(list)
    for cpu in cpuinfo.cpus:
        groups[_core_key(cpu)].append(cpu.processor)
    cores = _sorted_cores(Core(socket, socket, tuple(sorted(cpus))) for (socket, _), cpus in groups.items())
    nodes: dict[int, set[int]] = defaultdict(set)
    for core in cores:
        nodes[core.socket].update(core.cpus)
    return Topology(
        online_cpus=frozenset(cpu.processor for cpu in cpuinfo.cpus),
        sockets=len(nodes),
        nodes={node: frozenset(cpus) for node, cpus in sorted(nodes.items())},
        cores=cores,
        source="cpuinfo",
    )


def _core_key(cpu: LogicalCpu) -> tuple[int, int | str]:
    """(socket, core): core ids repeat across sockets; without one the processor is its own core."""
    socket = cpu.physical_id if cpu.physical_id is not None else 0
    return (socket, cpu.core_id) if cpu.core_id is not None else (socket, f"processor {cpu.processor}")
