"""sysfs -> sockets, NUMA nodes and their CPU lists, physical cores vs SMT siblings."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.facts.cpu import CpuInfo


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


def read_topology(sys_root: Path | None, cpuinfo: CpuInfo) -> Topology:
    """Topology from a /sys-like tree; from the cpuinfo fields when sys_root is None or lacks CPU topology."""
    raise NotImplementedError
