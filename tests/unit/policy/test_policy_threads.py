"""Thread lists per rank from the allowed CPUs, for recorded machines and containers."""

from __future__ import annotations

import dataclasses

import pytest

from service.facts.cpulist import format_cpulist
from service.facts.hardware import read_hardware
from service.policy.machine.threads import plan_threads, worker_omp_env
from tests.unit.conftest import CPUINFO, SYSFS

# (dump, tp override, reserved) -> (bind string, reserved CPUs)
CASES = [
    (("sysfs", "two_socket_smt"), None, 1, "0-7|8-14", "15"),
    (("sysfs", "smt_off"), None, 1, "0-7|8-14", "15"),
    (("sysfs", "container_cpuset"), None, 1, "2-4", "5"),
    (("sysfs", "memory_only_node"), None, 1, "0-3|4-6", "7"),
    (("sysfs", "two_socket_smt"), 1, 1, "0-7", "8"),
    (("sysfs", "two_socket_smt"), 4, 2, "0-3|4-7|8-10|12-14", "11,15"),  # last ranks first, as vLLM
    (("sysfs", "two_socket_smt"), None, 0, "0-7|8-15", ""),
    (("cpuinfo", "epyc_9654_zen4.txt"), None, 1, "0-3|4-6", "7"),
    (("cpuinfo", "xeon_8480_sapphirerapids.txt"), None, 1, "0-3|4-6", "7"),
    (("cpuinfo", "build_machine.txt"), None, 1, "0", "1"),
    (("cpuinfo", "graviton3_neoverse_v1.txt"), None, 1, "0-6", "7"),
]


def hardware(kind: str, name: str):
    if kind == "sysfs":
        return read_hardware(sysfs_root=SYSFS / name / "sys")
    return read_hardware(cpuinfo_path=CPUINFO / name)


@pytest.mark.parametrize("dump,tp,reserved,bind,kept", CASES)
def test_bind_lists(dump, tp, reserved, bind, kept):
    hw = hardware(*dump)
    plan = plan_threads(hw.topology, hw.limits, tp, reserved)
    assert plan.error is None
    assert (plan.bind, format_cpulist(plan.reserved)) == (bind, kept)


def test_smt_siblings_are_left_out():
    hw = hardware("sysfs", "two_socket_smt")
    plan = plan_threads(hw.topology, hw.limits, None, 1)
    used = {c for r in plan.ranks for c in r} | set(plan.reserved)
    assert used.isdisjoint(range(16, 32))
    assert "SMT siblings left out" in plan.reason


def test_default_tp_is_numa_nodes_with_allowed_cpus():
    assert plan_threads(*_topo_limits("two_socket_smt"), None, 1).tp_size == 2
    assert plan_threads(*_topo_limits("container_cpuset"), None, 1).tp_size == 1


def _topo_limits(name):
    hw = hardware("sysfs", name)
    return hw.topology, hw.limits


def test_container_cpuset_never_leaves_the_cpuset():
    topo, limits = _topo_limits("container_cpuset")
    plan = plan_threads(topo, limits, None, 1)
    assert {c for r in plan.ranks for c in r} | set(plan.reserved) <= {2, 3, 4, 5, 18, 19, 20, 21}
    assert "cpuset" in plan.reason


def test_cpu_quota_cuts_threads():
    topo, limits = _topo_limits("two_socket_smt")
    plan = plan_threads(topo, dataclasses.replace(limits, cpu_quota=4.0), None, 1)
    assert sum(map(len, plan.ranks)) == 3 and len(plan.reserved) == 1
    assert "quota" in plan.reason


def test_tp_smaller_than_nodes_warns_about_idle_nodes_and_reserves_an_idle_core():
    topo, limits = _topo_limits("two_socket_smt")
    plan = plan_threads(topo, limits, 1, 1)
    assert any("stay idle" in w for w in plan.warnings)
    assert plan.ranks == (tuple(range(8)),)


def test_tp_larger_than_cores_is_an_error():
    topo, limits = _topo_limits("container_cpuset")
    plan = plan_threads(topo, limits, 8, 1)
    assert plan.error and "needs at least 8 physical cores" in plan.error


def test_a_cpuset_of_offline_cpus_is_an_error_naming_the_lists():
    topo, limits = _topo_limits("container_cpuset")
    plan = plan_threads(topo, dataclasses.replace(limits, allowed_cpus=frozenset()), None, 1)
    assert plan.error == (
        "no usable CPU: online CPUs & cgroup cpuset.cpus.effective have no CPU in common (online: 0-31)"
    )


def test_one_core_keeps_its_rank_and_warns_about_reservation():
    topo, limits = _topo_limits("container_cpuset")
    plan = plan_threads(topo, dataclasses.replace(limits, allowed_cpus=frozenset({2})), None, 1)
    assert plan.ranks == ((2,),) and plan.reserved == ()
    assert any("reserved" in w for w in plan.warnings)


def test_worker_env_follows_the_preloaded_openmp_runtime():
    topo, limits = _topo_limits("two_socket_smt")
    plan = plan_threads(topo, limits, None, 1)
    assert worker_omp_env(plan, "")["OMP_PLACES"] == ["{0,1,2,3,4,5,6,7}", "{8,9,10,11,12,13,14}"]
    assert worker_omp_env(plan, "")["OMP_PROC_BIND"] == ["true", "true"]
    assert worker_omp_env(plan, "/usr/lib/libiomp5.so")["KMP_AFFINITY"][1].endswith("proclist=[8,9,10,11,12,13,14]")
    assert worker_omp_env(plan, "/x/libgomp.so.1")["GOMP_CPU_AFFINITY"][0] == "0 1 2 3 4 5 6 7"


def test_a_bind_list_the_user_set_is_kept_and_said_to_be_theirs():
    """Two instances on one host, each on its own cores: VLLM_CPU_OMP_THREADS_BIND as the user wrote it."""
    topo, limits = _topo_limits("two_socket_smt")
    plan = plan_threads(topo, limits, None, 1, user_bind="8-11|12-15")
    assert plan.error is None and plan.bind == "8-11|12-15" and plan.bind_source == "user"
    assert plan.tp_size == 2 and plan.tp_source == "user"
    assert "the service's plan would bind 0-7|8-14" in plan.reason
    assert set(plan.reserved) == set(range(32)) - set(range(8, 16))


@pytest.mark.parametrize(
    ("bind", "tp", "said"),
    [
        ("4-6", None, "names CPU(s) 6 outside the allowed CPUs 2-5,18-21"),  # the container's cpuset
        ("2-3|", None, "has an empty rank list"),
        ("2-3|x", None, "is not a CPU number"),
        ("2-3|4-5", 1, "lists 2 rank(s), tensor_parallel_size=1"),
    ],
)
def test_a_bind_list_the_user_set_that_cannot_be_served_refuses_the_start(bind, tp, said):
    topo, limits = _topo_limits("container_cpuset")
    plan = plan_threads(topo, limits, tp, 1, user_bind=bind)
    assert plan.error is not None and said in plan.error, plan.error


def test_vllms_own_binding_modes_pass_through_with_a_warning():
    topo, limits = _topo_limits("container_cpuset")
    plan = plan_threads(topo, limits, None, 1, user_bind="auto")
    assert plan.error is None and plan.bind == "auto" and plan.bind_source == "user"
    assert plan.ranks == plan_threads(topo, limits, None, 1).ranks  # the memory plan follows the service's ranks
    assert any("ignores a container's cpuset" in w and "would bind 2-4" in w for w in plan.warnings)
