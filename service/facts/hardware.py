"""One entry point that gathers the hardware facts, live or from a recorded dump."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from service.facts.cpu import CpuInfo, read_cpuinfo
from service.facts.limits import Limits, read_limits
from service.facts.node_memory import NodeMemory, read_node_memory
from service.facts.topology import Topology, read_topology

CGROUP_MOUNT = Path("/sys/fs/cgroup")
# "MemTotal:  263856880 kB" in /proc/meminfo.
_MEMTOTAL = re.compile(r"^MemTotal:\s+(\d+) kB$", re.MULTILINE)
_MEMAVAILABLE = re.compile(r"^MemAvailable:\s+(\d+) kB$", re.MULTILINE)


@dataclass(frozen=True)
class HardwareFacts:
    cpu: CpuInfo
    topology: Topology
    limits: Limits
    source: str  # "live" or a description of the recorded dump
    node_memory: dict[int, NodeMemory] = field(default_factory=dict)  # NUMA node -> its meminfo; {}: none read


def read_hardware(cpuinfo_path: Path | None = None, sysfs_root: Path | None = None) -> HardwareFacts:
    """Live machine when both are None; otherwise the recorded dump only (nothing of this machine leaks in).

    Recorded layout: `sysfs_root` is laid out like /sys (devices/system/cpu/..., devices/system/node/...,
    optional fs/cgroup/{cpuset.cpus.effective,cpu.max,memory.max}); node meminfo gives MemTotal.
    With only `sysfs_root`, the cpuinfo is taken from sysfs_root/../proc/cpuinfo.
    """
    if cpuinfo_path is None and sysfs_root is None:
        return _read_live()
    if sysfs_root is None:
        assert cpuinfo_path is not None
        return _read_recorded_cpuinfo(Path(cpuinfo_path))
    return _read_recorded_sysfs(Path(sysfs_root), _recorded_cpuinfo_path(cpuinfo_path, Path(sysfs_root)))


def _read_live() -> HardwareFacts:
    cpu = read_cpuinfo(Path("/proc/cpuinfo"))
    topology = read_topology(Path("/sys"), cpu)
    own_cgroup = Path("/proc/self/cgroup").read_text()
    meminfo = Path("/proc/meminfo").read_text()
    limits = read_limits(
        topology.online_cpus,
        cgroup_root=cgroup_dir(own_cgroup, CGROUP_MOUNT),
        cgroup_mount=CGROUP_MOUNT,
        cgroup_v1=cgroup_v1_dirs(own_cgroup, CGROUP_MOUNT),
        meminfo_total=memtotal_bytes(meminfo),
        meminfo_available=memavailable_bytes(meminfo),
        affinity=frozenset(os.sched_getaffinity(0)),
    )
    nodes = read_node_memory(Path("/sys"), available=True)
    return HardwareFacts(cpu=cpu, topology=topology, limits=limits, source="live", node_memory=nodes)


def _read_recorded_cpuinfo(cpuinfo_path: Path) -> HardwareFacts:
    """A cpuinfo alone: topology from its fields, every processor allowed, memory unknown."""
    cpu = read_cpuinfo(cpuinfo_path)
    topology = read_topology(None, cpu)
    limits = read_limits(topology.online_cpus, cgroup_root=None, meminfo_total=None, affinity=None)
    return HardwareFacts(cpu=cpu, topology=topology, limits=limits, source=f"recorded: cpuinfo {cpuinfo_path}")


def _recorded_cpuinfo_path(cpuinfo_path: Path | None, sysfs_root: Path) -> Path:
    if cpuinfo_path is not None:
        return Path(cpuinfo_path)
    beside = sysfs_root / ".." / "proc" / "cpuinfo"
    if not beside.is_file():
        raise ValueError(
            f"no cpuinfo recorded beside the sysfs dump (looked for {beside}); pass --cpuinfo with the "
            "recorded /proc/cpuinfo of that machine"
        )
    return beside


def _read_recorded_sysfs(sysfs_root: Path, cpuinfo_path: Path) -> HardwareFacts:
    cpu = read_cpuinfo(cpuinfo_path)
    topology = read_topology(sysfs_root, cpu)
    cgroup = sysfs_root / "fs" / "cgroup"
    nodes = read_node_memory(sysfs_root, available=False)
    limits = read_limits(
        topology.online_cpus,
        cgroup_root=cgroup if cgroup.is_dir() else None,
        cgroup_v1={c: cgroup / c for c in _V1_CONTROLLERS if (cgroup / c).is_dir()},
        meminfo_total=sum(n.total_bytes for n in nodes.values()) or None,
        affinity=None,
    )
    source = f"recorded: cpuinfo {cpuinfo_path}, sysfs {sysfs_root}"
    return HardwareFacts(cpu=cpu, topology=topology, limits=limits, source=source, node_memory=nodes)


def memtotal_bytes(meminfo_text: str) -> int | None:
    """MemTotal of a /proc/meminfo text, in bytes."""
    match = _MEMTOTAL.search(meminfo_text)
    return int(match[1]) * 1024 if match else None


def memavailable_bytes(meminfo_text: str) -> int | None:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping, page cache included), in bytes."""
    match = _MEMAVAILABLE.search(meminfo_text)
    return int(match[1]) * 1024 if match else None


def cgroup_dir(proc_self_cgroup: str, mount: Path) -> Path | None:
    """The cgroup v2 directory of a process from its /proc/PID/cgroup text ("0::/path" line)."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return mount / line.removeprefix("0::").lstrip("/")
    return None


_V1_CONTROLLERS = ("memory", "cpuset", "cpu")


def cgroup_v1_dirs(proc_self_cgroup: str, mount: Path) -> dict[str, Path]:
    """cgroup v1 directories of a process per controller ("4:memory:/path" lines). Inside a container
    without a cgroup namespace the path names the host's hierarchy while the mount shows the container's
    own cgroup at its root: then the mount root is the process's directory."""
    dirs: dict[str, Path] = {}
    for line in proc_self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller in _V1_CONTROLLERS:
                base = mount / controller
                own = base / path.lstrip("/")
                if base.is_dir():
                    dirs[controller] = own if own.is_dir() else base
    return dirs
