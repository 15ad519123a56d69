from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from service.facts.hardware import cgroup_dir, memtotal_bytes, read_hardware

FIXTURES = Path(__file__).parents[2] / "fixtures"
SYSFS = FIXTURES / "sysfs"
KIB = 1024
TWO_NODES_KIB = 263856880 + 264200932


def test_two_socket_tree_end_to_end() -> None:
    facts = read_hardware(sysfs_root=SYSFS / "two_socket_smt" / "sys")
    assert facts.cpu.microarchitecture == "icelake"
    assert (facts.topology.source, facts.topology.sockets, len(facts.topology.cores)) == ("sysfs", 2, 16)
    assert facts.limits.allowed_cpus == frozenset(range(32))
    assert facts.limits.allowed_cpus_source == "online CPUs"  # no affinity of this machine leaks in
    assert (facts.limits.memory_bytes, facts.limits.memory_source) == (TWO_NODES_KIB * KIB, "MemTotal")
    assert facts.limits.cpu_quota is None
    assert facts.source.startswith("recorded")


def test_smt_off_tree_end_to_end() -> None:
    facts = read_hardware(sysfs_root=SYSFS / "smt_off" / "sys")
    assert facts.limits.allowed_cpus == frozenset(range(16))
    assert not facts.topology.smt
    assert len(facts.cpu.cpus) == 16


def test_container_cpuset_tree_end_to_end() -> None:
    facts = read_hardware(SYSFS / "container_cpuset" / "proc" / "cpuinfo", SYSFS / "container_cpuset" / "sys")
    limits = facts.limits
    assert limits.allowed_cpus == frozenset({2, 3, 4, 5, 18, 19, 20, 21})
    assert limits.allowed_cpus_source == "online CPUs & cgroup cpuset.cpus.effective"
    assert (limits.cpu_quota, limits.memory_bytes, limits.memory_source) == (8.0, 17179869184, "cgroup memory.max")
    assert limits.memory_total_bytes == TWO_NODES_KIB * KIB
    assert {core.node for core in facts.topology.cores if set(core.cpus) & limits.allowed_cpus} == {0}


def test_memory_only_node_tree_end_to_end() -> None:
    facts = read_hardware(sysfs_root=SYSFS / "memory_only_node" / "sys")
    assert facts.cpu.microarchitecture == "sapphirerapids"
    assert facts.cpu.isa.amx
    assert facts.topology.nodes[2] == frozenset()
    assert facts.limits.memory_total_bytes == (131586532 + 132083236 + 134217728) * KIB


def test_cpuinfo_alone_takes_topology_from_cpuinfo_and_allows_every_processor() -> None:
    facts = read_hardware(cpuinfo_path=FIXTURES / "cpuinfo" / "epyc_9654_zen4.txt")
    assert facts.cpu.microarchitecture == "zen4"
    assert facts.topology.source == "cpuinfo"
    assert facts.topology.nodes == {
        0: frozenset({*range(4), *range(8, 12)}),
        1: frozenset({*range(4, 8), *range(12, 16)}),
    }
    assert facts.limits.allowed_cpus == frozenset(range(16))
    assert (facts.limits.memory_bytes, facts.limits.memory_source) == (None, "unknown")


def test_recorded_kvm_guests_are_named_by_their_part_and_keep_the_isa_they_see() -> None:
    emr = read_hardware(cpuinfo_path=FIXTURES / "cpuinfo" / "xeon_emeraldrapids_kvm_noamx.txt").cpu
    assert (emr.microarchitecture, emr.microarchitecture_source) == ("emeraldrapids", "archspec + family/model")
    assert emr.isa.avx512_bf16 and not emr.isa.amx  # AMX hidden by the hypervisor: the backend must not use it
    zen5 = read_hardware(cpuinfo_path=FIXTURES / "cpuinfo" / "epyc_zen5_kvm.txt").cpu
    assert (zen5.microarchitecture, zen5.microarchitecture_source) == ("zen5", "family/model table")
    assert zen5.isa.avx512_bf16 and not zen5.isa.amx_tile


def test_sysfs_alone_without_cpuinfo_beside_it_asks_for_one(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    with pytest.raises(ValueError, match="--cpuinfo"):
        read_hardware(sysfs_root=tmp_path / "sys")


def test_helpers_parse_meminfo_and_proc_self_cgroup() -> None:
    assert memtotal_bytes("MemTotal:       25276502 kB\nMemFree:  1 kB\n") == 25276502 * KIB
    assert memtotal_bytes("MemFree:  1 kB\n") is None
    mount = Path("/sys/fs/cgroup")
    assert cgroup_dir("0::/kubepods/pod1/abc\n", mount) == mount / "kubepods/pod1/abc"
    assert cgroup_dir("0::/\n", mount) == mount
    assert cgroup_dir("4:memory:/x\n1:cpu:/\n", mount) is None  # cgroup v1 only


def test_live_detector_agrees_with_torch_and_the_kernel() -> None:
    facts = read_hardware()
    assert facts.source == "live"
    assert facts.cpu.isa.avx512_bf16 == torch.cpu._is_avx512_bf16_supported()
    assert facts.cpu.isa.amx_tile == torch.cpu._is_amx_tile_supported()
    assert facts.limits.allowed_cpus <= frozenset(os.sched_getaffinity(0))
    assert facts.limits.allowed_cpus == frozenset(os.sched_getaffinity(0)) & facts.topology.online_cpus
    assert facts.topology.online_cpus == frozenset(cpu.processor for cpu in facts.cpu.cpus)
    assert facts.limits.memory_total_bytes == memtotal_bytes(Path("/proc/meminfo").read_text())
    free = facts.limits.memory_available_bytes
    assert free is not None and 0 < free <= facts.limits.memory_bytes


def test_cgroup_v1_dirs_fall_back_to_the_mount_root_inside_a_container(tmp_path):
    from service.facts.hardware import cgroup_v1_dirs

    (tmp_path / "memory").mkdir()
    (tmp_path / "cpuset" / "kubepods" / "pod1").mkdir(parents=True)
    text = "12:memory:/docker/abc\n3:cpuset:/kubepods/pod1\n1:name=systemd:/\n0::/\n"
    dirs = cgroup_v1_dirs(text, tmp_path)
    assert dirs == {"memory": tmp_path / "memory", "cpuset": tmp_path / "cpuset" / "kubepods" / "pod1"}
