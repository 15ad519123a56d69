from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.facts.cpu import read_cpuinfo
from service.facts.topology import Core, read_topology

FIXTURES = Path(__file__).parents[2] / "fixtures"
SYSFS = FIXTURES / "sysfs"
CPUINFO = FIXTURES / "cpuinfo"


def _recorded(tree: str):
    return SYSFS / tree / "sys", read_cpuinfo(SYSFS / tree / "proc" / "cpuinfo")


NODE0_SMT = frozenset({*range(0, 8), *range(16, 24)})
NODE1_SMT = frozenset({*range(8, 16), *range(24, 32)})


def test_two_sockets_with_smt() -> None:
    topology = read_topology(*_recorded("two_socket_smt"))
    assert topology.source == "sysfs"
    assert topology.online_cpus == frozenset(range(32))
    assert topology.sockets == 2
    assert topology.nodes == {0: NODE0_SMT, 1: NODE1_SMT}
    assert topology.smt
    assert len(topology.cores) == 16
    assert topology.cores[0] == Core(socket=0, node=0, cpus=(0, 16))
    assert topology.cores[8] == Core(socket=1, node=1, cpus=(8, 24))
    assert [core.cpus[0] for core in topology.cores] == list(range(16))


def test_smt_off_leaves_one_cpu_per_core() -> None:
    topology = read_topology(*_recorded("smt_off"))
    assert topology.online_cpus == frozenset(range(16))
    assert topology.nodes == {0: frozenset(range(8)), 1: frozenset(range(8, 16))}
    assert not topology.smt
    assert topology.cores[15] == Core(socket=1, node=1, cpus=(15,))


def test_memory_only_node_is_kept_with_no_cpus() -> None:
    topology = read_topology(*_recorded("memory_only_node"))
    assert topology.nodes[2] == frozenset()
    assert sorted(topology.nodes) == [0, 1, 2]
    assert sorted(topology.cpu_nodes) == [0, 1]
    assert topology.cores[4] == Core(socket=1, node=1, cpus=(4, 12))


def test_sysfs_and_cpuinfo_agree_on_a_machine_with_a_numa_node_per_socket() -> None:
    sys_root, cpuinfo = _recorded("two_socket_smt")
    from_sysfs, from_cpuinfo = read_topology(sys_root, cpuinfo), read_topology(None, cpuinfo)
    assert from_cpuinfo.source == "cpuinfo"
    assert (from_cpuinfo.online_cpus, from_cpuinfo.sockets, from_cpuinfo.nodes, from_cpuinfo.cores) == (
        from_sysfs.online_cpus,
        from_sysfs.sockets,
        from_sysfs.nodes,
        from_sysfs.cores,
    )


def test_tree_without_cpu_topology_falls_back_to_cpuinfo(tmp_path: Path) -> None:
    shutil.copytree(SYSFS / "two_socket_smt" / "sys" / "devices" / "system" / "node", tmp_path / "devices/system/node")
    topology = read_topology(tmp_path, read_cpuinfo(CPUINFO / "xeon_8380_icelake.txt"))
    assert topology.source == "cpuinfo"
    assert topology.sockets == 2


def test_no_node_dirs_means_one_node_with_every_online_cpu(tmp_path: Path) -> None:
    shutil.copytree(SYSFS / "smt_off" / "sys" / "devices" / "system" / "cpu", tmp_path / "devices/system/cpu")
    topology = read_topology(tmp_path, read_cpuinfo(SYSFS / "smt_off" / "proc" / "cpuinfo"))
    assert topology.source == "sysfs"
    assert topology.nodes == {0: frozenset(range(16))}
    assert {core.node for core in topology.cores} == {0}
    assert topology.sockets == 2


def test_older_kernels_name_siblings_thread_siblings_list(tmp_path: Path) -> None:
    shutil.copytree(SYSFS / "two_socket_smt" / "sys", tmp_path / "sys")
    for newer in (tmp_path / "sys").glob("devices/system/cpu/cpu*/topology/core_cpus_list"):
        newer.unlink()
    topology = read_topology(tmp_path / "sys", read_cpuinfo(CPUINFO / "xeon_8380_icelake.txt"))
    assert topology.cores[3] == Core(socket=0, node=0, cpus=(3, 19))


def test_core_ids_repeat_across_sockets_in_cpuinfo() -> None:
    topology = read_topology(None, read_cpuinfo(CPUINFO / "epyc_9654_zen4.txt"))
    assert topology.sockets == 2
    assert len(topology.cores) == 8  # 2 sockets x 4 cores, core ids 0-3 on each
    assert topology.cores[4] == Core(socket=1, node=1, cpus=(4, 12))


def test_hybrid_client_part_mixes_smt_and_single_thread_cores() -> None:
    topology = read_topology(None, read_cpuinfo(CPUINFO / "core_i7_12700k_alderlake.txt"))
    assert len(topology.cores) == 12
    assert [len(core.cpus) for core in topology.cores] == [2] * 8 + [1] * 4
    assert topology.nodes == {0: frozenset(range(20))}


@pytest.mark.parametrize("name", ["graviton3_neoverse_v1", "ampere_altra_neoverse_n1"])
def test_arm_cpuinfo_without_ids_is_one_core_per_processor_on_socket_0(name: str) -> None:
    info = read_cpuinfo(CPUINFO / f"{name}.txt")
    topology = read_topology(None, info)
    assert topology.sockets == 1
    assert topology.cores == tuple(Core(socket=0, node=0, cpus=(cpu.processor,)) for cpu in info.cpus)
    assert not topology.smt


def _copy(tmp_path: Path, tree: str = "two_socket_smt") -> Path:
    shutil.copytree(SYSFS / tree / "sys", tmp_path / "sys")
    return tmp_path / "sys"


def test_an_online_cpu_in_no_numa_node_is_an_error_naming_the_nodes(tmp_path: Path) -> None:
    sys_root = _copy(tmp_path)
    (sys_root / "devices/system/node/node1/cpulist").write_text("8-15\n")
    with pytest.raises(ValueError, match=r"node: online CPU\(s\) 24-31 are in no NUMA node's cpulist"):
        read_topology(sys_root, read_cpuinfo(CPUINFO / "xeon_8380_icelake.txt"))


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        ("cpu/cpu3/topology/physical_package_id", "zero\n", "physical_package_id holds 'zero', not a whole number"),
        ("cpu/cpu3/topology/core_cpus_list", "3,?\n", "core_cpus_list: bad CPU list"),
        ("cpu/online", "0-\n", "cpu/online: bad CPU list"),
        ("node/node0/cpulist", "x\n", "node0/cpulist: bad CPU list"),
    ],
)
def test_a_sysfs_file_that_does_not_parse_is_named(tmp_path: Path, file: str, text: str, message: str) -> None:
    sys_root = _copy(tmp_path)
    (sys_root / "devices/system" / file).write_text(text)
    with pytest.raises(ValueError, match=message):
        read_topology(sys_root, read_cpuinfo(CPUINFO / "xeon_8380_icelake.txt"))


def test_only_node_directories_count_as_nodes(tmp_path: Path) -> None:
    sys_root = _copy(tmp_path)
    (sys_root / "devices/system/node/node0.bak").mkdir()
    topology = read_topology(sys_root, read_cpuinfo(CPUINFO / "xeon_8380_icelake.txt"))
    assert sorted(topology.nodes) == [0, 1]
