"""Tensor parallel across NUMA nodes: a recorded two-node machine through the path `serve` takes (facts ->
policy -> report -> the environment vLLM is started with), and the simulated nodes the integration test runs."""

from __future__ import annotations

from service.facts.cpulist import parse_cpulist
from service.settings import Settings
from service.startup import apply, build_report
from tests.unit.conftest import CPUINFO, SYSFS

TWO_NODES = SYSFS / "two_socket_smt" / "sys"


def node_cpus(sys_root, node: int) -> frozenset[int]:
    return parse_cpulist((sys_root / "devices" / "system" / "node" / f"node{node}" / "cpulist").read_text())


def started_env(settings: Settings, **where) -> tuple[dict[str, str], object]:
    report = build_report(settings, model=None, environ={}, **where)
    environ: dict[str, str] = {}
    apply(report, environ)
    return environ, report


def test_two_node_machine_runs_one_rank_per_node():
    environ, report = started_env(Settings(), sysfs=TWO_NODES)
    decisions = {d.setting: d for d in report.decisions}
    assert decisions["engine.tensor_parallel_size"].value == 2
    assert decisions["engine.tensor_parallel_size"].reason.startswith("2 NUMA node(s) hold allowed CPUs (0, 1)")
    ranks = [parse_cpulist(r) for r in environ["VLLM_CPU_OMP_THREADS_BIND"].split("|")]
    assert environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-7|8-14"  # one thread per core; CPU 15 for the API server
    assert environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    for node, cpus in enumerate(ranks):
        assert cpus <= node_cpus(TWO_NODES, node), (node, cpus)  # each rank's memory stays local
    assert not any(cpu >= 16 for cpus in ranks for cpu in cpus)  # SMT siblings 16-31 left out
    assert "topology.numa_nodes" not in decisions  # real nodes: nothing simulated


def test_simulated_nodes_on_a_one_node_machine_are_a_named_decision():
    """What test_tensor_parallel.py starts on the 2-core build machine: two simulated nodes, one core each."""
    environ, report = started_env(
        Settings(simulate_numa_nodes=2, reserved_cpus=0), cpuinfo=CPUINFO / "build_machine.txt"
    )
    decisions = {d.setting: d for d in report.decisions}
    simulated = decisions["topology.numa_nodes"]
    assert (simulated.value, simulated.source) == (2, "user")
    assert simulated.reason.startswith("simulated: ")
    assert decisions["engine.tensor_parallel_size"].value == 2
    assert "2 simulated NUMA node(s)" in decisions["engine.tensor_parallel_size"].reason
    assert environ["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert any("simulated" in w for w in report.warnings)


def test_simulated_nodes_split_the_allowed_cores_not_the_real_nodes():
    _, report = started_env(Settings(simulate_numa_nodes=4, reserved_cpus=0), sysfs=TWO_NODES)
    assert report.plan.threads.bind == "0-3|4-7|8-11|12-15"


def test_more_simulated_nodes_than_cores_is_an_error():
    settings = Settings(simulate_numa_nodes=3)
    report = build_report(settings, model=None, environ={}, cpuinfo=CPUINFO / "build_machine.txt")
    assert any("simulate_numa_nodes=3 needs at least 3 physical cores" in e for e in report.errors)


def test_vllms_own_numa_simulation_is_refused_loudly():
    """vLLM asserts VLLM_CPU_OMP_THREADS_BIND=auto when VLLM_CPU_SIM_MULTI_NUMA is set; the service binds
    explicitly, so the engine would die at start: the report says so before anything starts."""
    report = build_report(Settings(), model=None, environ={"VLLM_CPU_SIM_MULTI_NUMA": "1"}, sysfs=TWO_NODES)
    assert any("VLLM_CPU_SIM_MULTI_NUMA" in e and "SERVICE_SIMULATE_NUMA_NODES" in e for e in report.errors)
    assert not report.ok
