"""What this process may use: affinity + cgroup cpuset, CPU quota and memory limit (cgroup v2, and v1 on
hosts that still mount it: hybrid hierarchies are common on older Docker and Kubernetes nodes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from service.cpulist import parse_cpulist

_Number = TypeVar("_Number", int, float)


@dataclass(frozen=True)
class Limits:
    allowed_cpus: frozenset[int]
    allowed_cpus_source: str  # e.g. "sched_getaffinity", "cgroup cpuset.cpus.effective", "online CPUs"
    cpu_quota: float | None  # cgroup cpu.max quota/period in CPUs, None when unlimited
    memory_bytes: int | None  # what we may use: cgroup memory.max if set, else MemTotal
    memory_total_bytes: int | None  # the machine's MemTotal
    memory_source: str  # e.g. "cgroup memory.max", "MemTotal", "unknown"
    # Free for this service right now: MemAvailable, and under a cgroup limit that limit minus what the cgroup
    # already uses (memory.current), whichever is lower; None when not known (recorded dumps).
    memory_available_bytes: int | None = None


def read_limits(
    online_cpus: frozenset[int],
    *,
    cgroup_root: Path | None,
    meminfo_total: int | None,
    affinity: frozenset[int] | None,
    cgroup_mount: Path | None = None,
    cgroup_v1: Mapping[str, Path] | None = None,
    meminfo_available: int | None = None,
) -> Limits:
    """Combine affinity, cgroup files under cgroup_root (cpuset.cpus.effective, cpu.max, memory.max).

    cpu.max and memory.max bind from every ancestor too: with `cgroup_mount` given, the tightest
    value over cgroup_root and its parents up to cgroup_mount counts. cpuset.cpus.effective already
    folds in the ancestors, so only cgroup_root's is read. `cgroup_v1` maps v1 controllers ("memory",
    "cpuset", "cpu") to this process's directory in each; their limits count the same way.
    """
    cgroup_dirs = _cgroup_chain(cgroup_root, cgroup_mount)
    v1 = cgroup_v1 or {}
    allowed, allowed_source = _allowed_cpus(online_cpus, affinity, cgroup_root)
    v1_cpuset = _read_value(v1["cpuset"] / "cpuset.effective_cpus") if "cpuset" in v1 else None
    if v1_cpuset:
        allowed, allowed_source = allowed & parse_cpulist(v1_cpuset), f"{allowed_source} & cgroup v1 cpuset"
    v2_memory = _tightest(_memory_max(d) for d in cgroup_dirs)
    v1_memory = _v1_memory(v1.get("memory"))
    if v1_memory is not None and (v2_memory is None or v1_memory < v2_memory):
        memory_bytes, memory_source = _memory(v1_memory, meminfo_total, "cgroup v1 memory.limit_in_bytes")
    else:
        memory_bytes, memory_source = _memory(v2_memory, meminfo_total, "cgroup memory.max")
    return Limits(
        allowed_cpus=allowed,
        allowed_cpus_source=allowed_source,
        cpu_quota=_tightest([*(_cpu_max(d) for d in cgroup_dirs), _v1_quota(v1.get("cpu"))]),
        memory_bytes=memory_bytes,
        memory_total_bytes=meminfo_total,
        memory_source=memory_source,
        memory_available_bytes=_tightest(
            [meminfo_available, *(_cgroup_headroom(d) for d in cgroup_dirs), _v1_headroom(v1.get("memory"))]
        ),
    )


def _cgroup_chain(cgroup_root: Path | None, cgroup_mount: Path | None) -> list[Path]:
    """cgroup_root, then its parents up to and including cgroup_mount."""
    if cgroup_root is None:
        return []
    if cgroup_mount is None or not cgroup_root.is_relative_to(cgroup_mount):
        return [cgroup_root]
    depth = len(cgroup_root.relative_to(cgroup_mount).parts)
    return [cgroup_root, *list(cgroup_root.parents)[:depth]]


def _allowed_cpus(
    online: frozenset[int], affinity: frozenset[int] | None, cgroup_root: Path | None
) -> tuple[frozenset[int], str]:
    """online ∩ affinity ∩ cpuset.cpus.effective; the source names every list that took part."""
    allowed, sources = online, ["online CPUs"]
    if affinity is not None:
        allowed, sources = allowed & affinity, [*sources, "sched_getaffinity"]
    cpuset = _read_value(cgroup_root / "cpuset.cpus.effective") if cgroup_root is not None else None
    # An empty file means the cpuset controller states nothing here, not "no CPUs at all".
    if cpuset:
        allowed, sources = allowed & parse_cpulist(cpuset), [*sources, "cgroup cpuset.cpus.effective"]
    return allowed, " & ".join(sources)


def _read_value(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None


def _cpu_max(cgroup_dir: Path) -> float | None:
    """cpu.max "QUOTA PERIOD" -> QUOTA/PERIOD CPUs; "max PERIOD" or no file -> None."""
    value = _read_value(cgroup_dir / "cpu.max")
    if value is None:
        return None
    quota, _, period = value.partition(" ")
    return None if quota == "max" else int(quota) / int(period or 100000)


def _memory_max(cgroup_dir: Path) -> int | None:
    value = _read_value(cgroup_dir / "memory.max")
    return None if value in (None, "max") else int(value)


def _cgroup_headroom(cgroup_dir: Path) -> int | None:
    """memory.max - memory.current of a v2 cgroup with a limit."""
    limit, used = _memory_max(cgroup_dir), _read_value(cgroup_dir / "memory.current")
    return None if limit is None or used is None else max(0, limit - int(used))


def _v1_headroom(directory: Path | None) -> int | None:
    limit = _v1_memory(directory)
    used = _read_value(directory / "memory.usage_in_bytes") if directory is not None else None
    return None if limit is None or used is None else max(0, limit - int(used))


# cgroup v1 writes "no limit" as the largest page-aligned 64-bit value, not as a word.
_V1_UNLIMITED = 1 << 62


def _v1_memory(directory: Path | None) -> int | None:
    value = _read_value(directory / "memory.limit_in_bytes") if directory is not None else None
    return None if value is None or int(value) >= _V1_UNLIMITED else int(value)


def _v1_quota(directory: Path | None) -> float | None:
    """cpu.cfs_quota_us / cpu.cfs_period_us in CPUs; -1 means no quota."""
    if directory is None:
        return None
    quota, period = (_read_value(directory / f) for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    return None if quota in (None, "-1") or not period else int(quota) / int(period)


def _tightest(values: Iterable[_Number | None]) -> _Number | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _memory(limit: int | None, total: int | None, limit_source: str) -> tuple[int | None, str]:
    if limit is not None and (total is None or limit < total):
        return limit, limit_source
    if total is not None:
        return total, "MemTotal"
    return None, "unknown"
