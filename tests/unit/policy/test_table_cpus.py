"""The CPUs of a model table's engines (policy/machine/table_cpus.py) on recorded machines, and the child's slot applied to a
real process the way the front end starts an engine."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from service.facts.hardware import read_hardware
from service.measurements.store import Row
from service.policy.machine import table_cpus
from service.policy.machine.table_cpus import plan_table_cpus, split_slots
from service.server.router.engines import _prepare_child
from tests.unit.conftest import SYSFS


def _recorded(name: str):
    hardware = read_hardware(SYSFS / name / "proc/cpuinfo", SYSFS / name / "sys")
    return hardware.topology, hardware.limits


def test_slots_are_whole_cores_in_node_order_one_node_each_where_the_engines_divide_the_nodes():
    topology, limits = _recorded("two_socket_smt")
    node0, node1 = split_slots(topology, limits, 2)
    assert node0 == tuple(sorted([*range(0, 8), *range(16, 24)])) and node1 == tuple(
        sorted([*range(8, 16), *range(24, 32)])
    )
    three = split_slots(topology, limits, 3)
    assert [len(s) // 2 for s in three] == [6, 5, 5]  # 16 cores, siblings together
    assert set().union(*three) == limits.allowed_cpus and sum(map(len, three)) == len(limits.allowed_cpus)


def test_slots_stay_inside_a_containers_cpuset():
    topology, limits = _recorded("container_cpuset")  # CPUs 2-5 and their siblings 18-21
    assert split_slots(topology, limits, 2) == ((2, 3, 18, 19), (4, 5, 20, 21))
    assert split_slots(topology, limits, 5) is None


def test_the_users_choice_is_kept_and_a_split_without_a_core_per_engine_is_refused_with_the_numbers():
    topology, limits = _recorded("container_cpuset")
    shared = plan_table_cpus("shared", "user", topology, limits, 2)
    assert (shared.mode, shared.slots, shared.decision.source) == ("shared", (), "user")
    split = plan_table_cpus("split", "user", topology, limits, 4)
    assert split.mode == "split" and split.slots == ((2, 18), (3, 19), (4, 20), (5, 21)) and split.error is None
    refused = plan_table_cpus("split", "user", topology, limits, 5)
    assert refused.error and "5 engines" in refused.error and "4 allowed core(s)" in refused.error
    assert plan_table_cpus("split", "user", topology, limits, 1).mode == "all"


def test_a_users_bind_lists_bind_every_engine_so_auto_shares_and_split_is_refused():
    topology, limits = _recorded("two_socket_smt")
    shared = plan_table_cpus("auto", "policy", topology, limits, 2, user_bind="3-5")
    assert (shared.mode, shared.slots, shared.decision.source) == ("shared", (), "user")
    assert "VLLM_CPU_OMP_THREADS_BIND=3-5" in shared.decision.reason
    refused = plan_table_cpus("split", "user", topology, limits, 2, user_bind="3-5")
    assert refused.error and "VLLM_CPU_OMP_THREADS_BIND=3-5" in refused.error


def _measured(monkeypatch, low: float, high: float) -> None:
    fake = Row(key=table_cpus.TOGETHER, cpu="x", machine="m", command="c", date="d", value=(low + high) / 2)
    monkeypatch.setattr(table_cpus, "row", lambda key: fake.model_copy(update={"interval": (low, high)}))
    monkeypatch.setattr(table_cpus, "cite", lambda key: f"cited {key}")


@pytest.mark.parametrize(("low", "high", "mode"), [(1.2, 1.9, "split"), (0.8, 1.4, "shared"), (0.5, 0.9, "shared")])
def test_auto_follows_the_measurement_of_two_engines_at_once(monkeypatch, low, high, mode):
    _measured(monkeypatch, low, high)
    topology, limits = _recorded("two_socket_smt")
    plan = plan_table_cpus("auto", "policy", topology, limits, 2)
    assert plan.mode == mode and f"cited {table_cpus.TOGETHER}" in plan.decision.reason
    assert bool(plan.slots) == (mode == "split")


def test_auto_shares_where_there_are_fewer_cores_than_engines(monkeypatch):
    _measured(monkeypatch, 1.5, 2.0)
    topology, limits = _recorded("container_cpuset")
    plan = plan_table_cpus("auto", "policy", topology, limits, 6)
    assert plan.mode == "shared" and plan.error is None and "fewer allowed cores" in plan.decision.reason


def test_the_store_holds_the_rows_auto_cites():
    topology, limits = _recorded("two_socket_smt")
    plan = plan_table_cpus("auto", "policy", topology, limits, 2)
    assert table_cpus.TOGETHER in plan.decision.reason and table_cpus.ALONE in plan.decision.reason


def test_a_child_started_on_its_slot_reads_that_slot_as_its_allowed_cpus():
    first = min(os.sched_getaffinity(0))
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        preexec_fn=functools.partial(_prepare_child, (first,)),
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == f"[{first}]"
