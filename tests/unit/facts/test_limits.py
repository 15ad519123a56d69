from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.facts.limits import read_limits

ONLINE = frozenset(range(32))
GIB = 2**30


def _cgroup(directory: Path, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (directory / name.replace("_", ".")).write_text(value + "\n")  # cpu_max -> cpu.max
    return directory


def test_nothing_but_online_cpus() -> None:
    limits = read_limits(ONLINE, cgroup_root=None, meminfo_total=None, affinity=None)
    assert limits.allowed_cpus == ONLINE
    assert limits.allowed_cpus_source == "online CPUs"
    assert (limits.cpu_quota, limits.memory_bytes, limits.memory_source) == (None, None, "unknown")


def test_allowed_is_online_and_affinity_and_cpuset(tmp_path: Path) -> None:
    root = _cgroup(tmp_path, cpuset_cpus_effective="2-5,18-21")
    limits = read_limits(frozenset(range(20)), cgroup_root=root, meminfo_total=None, affinity=frozenset(range(4, 32)))
    assert limits.allowed_cpus == frozenset({4, 5, 18, 19})
    assert limits.allowed_cpus_source == "online CPUs & sched_getaffinity & cgroup cpuset.cpus.effective"


@pytest.mark.parametrize(("cpu_max", "quota"), [("max 100000", None), ("800000 100000", 8.0), ("50000 100000", 0.5)])
def test_cpu_max(tmp_path: Path, cpu_max: str, quota: float | None) -> None:
    limits = read_limits(ONLINE, cgroup_root=_cgroup(tmp_path, cpu_max=cpu_max), meminfo_total=None, affinity=None)
    assert limits.cpu_quota == quota


def test_memory_max_below_memtotal_wins(tmp_path: Path) -> None:
    root = _cgroup(tmp_path, memory_max=str(16 * GIB))
    limits = read_limits(ONLINE, cgroup_root=root, meminfo_total=512 * GIB, affinity=None)
    assert (limits.memory_bytes, limits.memory_total_bytes, limits.memory_source) == (
        16 * GIB,
        512 * GIB,
        "cgroup memory.max",
    )


@pytest.mark.parametrize("memory_max", ["max", str(1024 * GIB)])
def test_memory_max_unset_or_above_memtotal_leaves_memtotal(tmp_path: Path, memory_max: str) -> None:
    root = _cgroup(tmp_path, memory_max=memory_max)
    limits = read_limits(ONLINE, cgroup_root=root, meminfo_total=64 * GIB, affinity=None)
    assert (limits.memory_bytes, limits.memory_source) == (64 * GIB, "MemTotal")


def test_memory_max_without_memtotal(tmp_path: Path) -> None:
    limits = read_limits(
        ONLINE, cgroup_root=_cgroup(tmp_path, memory_max="1073741824"), meminfo_total=None, affinity=None
    )
    assert (limits.memory_bytes, limits.memory_source) == (GIB, "cgroup memory.max")


def test_ancestors_up_to_the_mount_bind_too(tmp_path: Path) -> None:
    mount = _cgroup(tmp_path / "cgroup", memory_max="max", cpu_max="max 100000")
    pod = _cgroup(mount / "kubepods" / "pod1", memory_max=str(8 * GIB), cpu_max="400000 100000")
    leaf = _cgroup(pod / "container", memory_max=str(32 * GIB), cpu_max="max 100000", cpuset_cpus_effective="0-3")
    limits = read_limits(ONLINE, cgroup_root=leaf, cgroup_mount=mount, meminfo_total=64 * GIB, affinity=None)
    assert (limits.memory_bytes, limits.cpu_quota) == (8 * GIB, 4.0)
    assert limits.allowed_cpus == frozenset(range(4))
    # Outside the mount nothing is read: only the leaf counts.
    alone = read_limits(ONLINE, cgroup_root=leaf, meminfo_total=64 * GIB, affinity=None)
    assert (alone.memory_bytes, alone.cpu_quota) == (32 * GIB, None)


def test_missing_cgroup_files_mean_no_limit(tmp_path: Path) -> None:
    limits = read_limits(ONLINE, cgroup_root=tmp_path / "absent", meminfo_total=GIB, affinity=None)
    assert (limits.allowed_cpus, limits.cpu_quota, limits.memory_bytes) == (ONLINE, None, GIB)
    assert limits.allowed_cpus_source == "online CPUs"


def test_cgroup_v1_limits_count_like_v2(tmp_path):
    memory, cpuset, cpu = (tmp_path / c for c in ("memory", "cpuset", "cpu"))
    for d in (memory, cpuset, cpu):
        d.mkdir()
    (memory / "memory.limit_in_bytes").write_text("8589934592\n")
    (cpuset / "cpuset.effective_cpus").write_text("0-3\n")
    (cpu / "cpu.cfs_quota_us").write_text("250000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    limits = read_limits(
        frozenset(range(8)),
        cgroup_root=None,
        meminfo_total=64 * GIB,
        affinity=None,
        cgroup_v1={"memory": memory, "cpuset": cpuset, "cpu": cpu},
    )
    assert limits.allowed_cpus == frozenset(range(4)) and "v1 cpuset" in limits.allowed_cpus_source
    assert (limits.memory_bytes, limits.memory_source) == (8 * GIB, "cgroup v1 memory.limit_in_bytes")
    assert limits.cpu_quota == 2.5


def test_cgroup_v1_unlimited_values_mean_no_limit(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    limits = read_limits(
        frozenset({0, 1}),
        cgroup_root=None,
        meminfo_total=4 * GIB,
        affinity=None,
        cgroup_v1={"memory": tmp_path / "memory", "cpu": tmp_path / "cpu"},
    )
    assert (limits.memory_bytes, limits.memory_source, limits.cpu_quota) == (4 * GIB, "MemTotal", None)


def test_free_memory_is_the_lowest_of_memavailable_and_each_limited_cgroups_headroom(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    parent = _cgroup(mount / "pod", memory_max=str(16 * GIB), memory_current=str(10 * GIB))
    leaf = _cgroup(parent / "ctr", memory_max=str(12 * GIB), memory_current=str(3 * GIB))
    limits = read_limits(
        ONLINE, cgroup_root=leaf, cgroup_mount=mount, meminfo_total=64 * GIB, meminfo_available=40 * GIB, affinity=None
    )
    assert (limits.memory_bytes, limits.memory_available_bytes) == (12 * GIB, 6 * GIB)  # the parent's 16 - 10
    alone = read_limits(ONLINE, cgroup_root=None, meminfo_total=64 * GIB, meminfo_available=40 * GIB, affinity=None)
    assert alone.memory_available_bytes == 40 * GIB


def test_cgroup_v1_headroom_counts_too(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "memory.limit_in_bytes").write_text(f"{8 * GIB}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{5 * GIB}\n")
    limits = read_limits(
        ONLINE,
        cgroup_root=None,
        cgroup_v1={"memory": memory},
        meminfo_total=64 * GIB,
        meminfo_available=40 * GIB,
        affinity=None,
    )
    assert (limits.memory_bytes, limits.memory_available_bytes) == (8 * GIB, 3 * GIB)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("cpu.max", "abc 100000", "holds 'abc', not a whole number"),
        ("cpu.max", "100000 0", "a CPU quota of 100000 per period 0 is not a positive share of a CPU"),
        ("memory.max", "lots", "holds 'lots', not a whole number"),
        ("memory.current", "", "holds '', not a whole number"),
        ("cpuset.cpus.effective", "0-x", "item '0-x' is not a CPU number N or a range N-M"),
    ],
)
def test_a_cgroup_file_that_does_not_parse_is_an_error_naming_it(
    tmp_path: Path, name: str, value: str, says: str
) -> None:
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / name).write_text(value + "\n")
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / name))}.*{re.escape(says)}"):
        read_limits(ONLINE, cgroup_root=tmp_path, meminfo_total=None, affinity=None)
