"""What this process may use: affinity + cgroup v2 cpuset, CPU quota and memory limit."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    allowed_cpus: frozenset[int]
    allowed_cpus_source: str  # e.g. "sched_getaffinity", "cgroup cpuset.cpus.effective", "online CPUs"
    cpu_quota: float | None  # cgroup cpu.max quota/period in CPUs, None when unlimited
    memory_bytes: int | None  # what we may use: cgroup memory.max if set, else MemTotal
    memory_total_bytes: int | None  # the machine's MemTotal
    memory_source: str  # e.g. "cgroup memory.max", "MemTotal", "unknown"


def read_limits(
    online_cpus: frozenset[int],
    *,
    cgroup_root: Path | None,
    meminfo_total: int | None,
    affinity: frozenset[int] | None,
) -> Limits:
    """Combine affinity, cgroup files under cgroup_root (cpuset.cpus.effective, cpu.max, memory.max)."""
    raise NotImplementedError
