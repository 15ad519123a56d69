"""One entry point that gathers the hardware facts, live or from a recorded dump."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.facts.cpu import CpuInfo
from service.facts.limits import Limits
from service.facts.topology import Topology


@dataclass(frozen=True)
class HardwareFacts:
    cpu: CpuInfo
    topology: Topology
    limits: Limits
    source: str  # "live" or a description of the recorded dump


def read_hardware(cpuinfo_path: Path | None = None, sysfs_root: Path | None = None) -> HardwareFacts:
    """Live machine when both are None; otherwise the recorded dump only (nothing of this machine leaks in).

    Recorded layout: `sysfs_root` is laid out like /sys (devices/system/cpu/..., devices/system/node/...,
    optional fs/cgroup/{cpuset.cpus.effective,cpu.max,memory.max}); node meminfo gives MemTotal.
    """
    raise NotImplementedError
