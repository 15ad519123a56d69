"""What this process may use: affinity + cgroup cpuset, CPU quota and memory limit (cgroup v2, and v1 on
hosts that still mount it: hybrid hierarchies are common on older Docker and Kubernetes nodes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from service.facts.sysfs_value import cpu_list, whole_number

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
    v1_cpuset = _read_cpuset(v1["cpuset"] / "cpuset.effective_cpus") if "cpuset" in v1 else None
    if v1_cpuset is not None:
        allowed, allowed_source = allowed & v1_cpuset, f"{allowed_source} & cgroup v1 cpuset"
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
    cpuset = _read_cpuset(cgroup_root / "cpuset.cpus.effective") if cgroup_root is not None else None
    if cpuset is not None:
        allowed, sources = allowed & cpuset, [*sources, "cgroup cpuset.cpus.effective"]
    return allowed, " & ".join(sources)


def _read_value(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None


def _read_cpuset(path: Path) -> frozenset[int] | None:
    """The CPU list in a cpuset file; None when absent or empty (the controller states nothing here, not "no
    CPUs at all")."""
    value = _read_value(path)
    if not value:
        return None
    return cpu_list(path, value)


def _read_int(path: Path, *, word: str | None = None) -> int | None:
    """A file holding one integer (or `word`, read as no limit, like None for an absent file); anything else is an
    error naming the file: a limit read wrong would size threads or the KV cache wrong."""
    value = _read_value(path)
    if value is None or value == word:
        return None
    return whole_number(path, value)


def _cpu_max(cgroup_dir: Path) -> float | None:
    """cpu.max "QUOTA PERIOD" -> QUOTA/PERIOD CPUs; "max PERIOD" or no file -> None."""
    path = cgroup_dir / "cpu.max"
    value = _read_value(path)
    if value is None:
        return None
    quota, _, period = value.partition(" ")
    return None if quota == "max" else _quota(path, whole_number(path, quota), whole_number(path, period or "100000"))


def _quota(path: Path, quota: int, period: int) -> float:
    if quota <= 0 or period <= 0:
        raise ValueError(f"{path}: a CPU quota of {quota} per period {period} is not a positive share of a CPU")
    return quota / period


def _memory_max(cgroup_dir: Path) -> int | None:
    return _read_int(cgroup_dir / "memory.max", word="max")


def _cgroup_headroom(cgroup_dir: Path) -> int | None:
    """memory.max - memory.current of a v2 cgroup with a limit."""
    limit, used = _memory_max(cgroup_dir), _read_int(cgroup_dir / "memory.current")
    return None if limit is None or used is None else max(0, limit - used)


def _v1_headroom(directory: Path | None) -> int | None:
    limit = _v1_memory(directory)
    used = _read_int(directory / "memory.usage_in_bytes") if directory is not None else None
    return None if limit is None or used is None else max(0, limit - used)


# cgroup v1 writes "no limit" as the largest page-aligned 64-bit value, not as a word.
_V1_UNLIMITED = 1 << 62


def _v1_memory(directory: Path | None) -> int | None:
    value = _read_int(directory / "memory.limit_in_bytes") if directory is not None else None
    return None if value is None or value >= _V1_UNLIMITED else value


def _v1_quota(directory: Path | None) -> float | None:
    """cpu.cfs_quota_us / cpu.cfs_period_us in CPUs; -1 means no quota."""
    if directory is None:
        return None
    quota = _read_int(directory / "cpu.cfs_quota_us", word="-1")
    period = _read_int(directory / "cpu.cfs_period_us")
    return None if quota is None or period is None else _quota(directory / "cpu.cfs_quota_us", quota, period)


def _tightest(values: Iterable[_Number | None]) -> _Number | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _memory(limit: int | None, total: int | None, limit_source: str) -> tuple[int | None, str]:
    if limit is not None and (total is None or limit < total):
        return limit, limit_source
    if total is not None:
        return total, "MemTotal"
    return None, "unknown"
