"""Each NUMA node's memory as its meminfo counts it (what vLLM's CPU worker checks its KV cache against), and the
KV cache the policy sizes to fit the node each rank binds to."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from service.facts.hardware import read_hardware
from service.facts.node_memory import NodeMemory, read_node_memory
from service.policy.engine.dtype import MEASUREMENTS, Measurement
from service.policy.engine.memory import default_headroom, rank_nodes
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import Settings
from tests.unit.conftest import CPUINFO, MODELS, SYSFS, software

GiB = 1024**3
KIB = 1024
LLAMA = "llama-3.1-8b-instruct"


def _node(root: Path, node: int, **kib: int) -> None:
    directory = root / "devices" / "system" / "node" / f"node{node}"
    directory.mkdir(parents=True)
    lines = [f"Node {node} {name.replace('_file', '(file)')}: {value:>12} kB" for name, value in kib.items()]
    (directory / "meminfo").write_text("\n".join([*lines, f"Node {node} HugePages_Total:     0", ""]))


def test_a_node_is_available_by_vllms_sum_and_only_where_read_live(tmp_path: Path) -> None:
    _node(tmp_path, 0, MemTotal=11101980, MemFree=9330880, Active_file=367872, Inactive_file=1015128, SReclaimable=1)
    _node(tmp_path, 1, MemTotal=2048, MemFree=1024)  # a tree without the file-page lines
    (tmp_path / "devices" / "system" / "node" / "possible").write_text("0-1\n")
    live = read_node_memory(tmp_path, available=True)
    assert live == {
        0: NodeMemory(11101980 * KIB, (9330880 + 367872 + 1015128 + 1) * KIB),
        1: NodeMemory(2048 * KIB, None),
    }
    assert live[0].usable_bytes == live[0].available_bytes and live[1].usable_bytes == 2048 * KIB
    recorded = read_node_memory(tmp_path, available=False)
    assert recorded == {n: NodeMemory(m.total_bytes, None) for n, m in live.items()}
    assert read_node_memory(tmp_path / "nothing", available=True) == {}


def test_the_live_nodes_are_read_and_hold_no_more_than_the_machine() -> None:
    facts = read_hardware()
    if not (Path("/sys/devices/system/node/node0/meminfo")).is_file():
        assert facts.node_memory == {}
        return
    assert facts.node_memory and all(m.available_bytes is not None for m in facts.node_memory.values())
    assert facts.limits.memory_total_bytes is not None
    # A lazily initialized node counts its pages as they are first used: never more than the machine's MemTotal.
    assert sum(m.total_bytes for m in facts.node_memory.values()) <= facts.limits.memory_total_bytes


def test_a_recorded_dump_gives_each_node_its_total_and_the_machine_their_sum() -> None:
    facts = read_hardware(sysfs_root=SYSFS / "two_socket_smt" / "sys")
    assert set(facts.node_memory) == {0, 1}
    assert all(m.available_bytes is None for m in facts.node_memory.values())
    assert facts.limits.memory_total_bytes == sum(m.total_bytes for m in facts.node_memory.values())


def test_each_rank_binds_to_the_node_of_its_first_cpu() -> None:
    nodes = {0: frozenset({0, 1}), 1: frozenset({2, 3})}
    memory = {0: NodeMemory(8 * GiB, None), 1: NodeMemory(16 * GiB, None)}
    assert rank_nodes(((2, 3), (0, 1)), nodes, memory) == ((1, memory[1]), (0, memory[0]))
    assert rank_nodes(((0,), (1,)), nodes, memory) == ((0, memory[0]), (0, memory[0]))
    assert rank_nodes(((0, 1),), nodes, {1: memory[1]}) == ()  # node 0's meminfo not read: not known
    assert rank_nodes((), nodes, memory) == ()


def _one_node(node: NodeMemory, machine: int = 24 * GiB):
    """The live machine's CPU and topology (its node 0), a machine limit of `machine`, node 0 showing `node`."""
    facts = read_hardware(cpuinfo_path=CPUINFO / "xeon_8480_sapphirerapids.txt")
    topology = dataclasses.replace(facts.topology, nodes={0: facts.topology.online_cpus})
    limits = dataclasses.replace(
        facts.limits, memory_bytes=machine, memory_available_bytes=machine, memory_source="MemTotal"
    )
    return dataclasses.replace(facts, topology=topology, limits=limits, node_memory={0: node})


def _plan(hardware, **settings):
    from service.facts.model import inspect_model

    settings = {"max_model_len": 4096, **settings}
    return plan_engine(PlanInputs(hardware, inspect_model(str(MODELS / LLAMA)), software(), Settings(**settings), {}))


def _kv(p) -> tuple[int, str]:
    d = next(d for d in p.decisions if d.setting == "engine.kv_cache_memory_bytes")
    return d.value, d.reason


def test_the_kv_cache_fits_the_node_vllm_checks_when_it_shows_less_than_the_machine() -> None:
    """A guest whose node 0 counted 10.6 of its 23.5 GiB (pages initialized lazily): the policy's 17.6 GiB KV cache
    was refused by vLLM's worker ("Available memory on node 0 (6.52/10.59 GiB)"), the engine did not start."""
    from service.facts.model import inspect_model

    weights = inspect_model(str(MODELS / LLAMA)).weight_bytes
    node = NodeMemory(total_bytes=40 * GiB, available_bytes=30 * GiB)
    roomy = _plan(_one_node(node, machine=64 * GiB), tensor_parallel_size=1)
    assert not roomy.errors
    kv, reason = _kv(roomy)
    headroom = default_headroom(40 * GiB)  # the node's
    assert kv == 30 * GiB - weights - headroom  # in the node: what it shows available, not the machine's 64 GiB
    assert kv + weights <= node.available_bytes
    assert "NUMA node 0's meminfo" in reason and "30.00 GiB available of 40.00 GiB" in reason
    assert "the machine's limit is 64.00 GiB (MemTotal)" in reason
    machine_kv, machine_reason = _kv(_plan(_one_node(NodeMemory(60 * GiB, 60 * GiB), 48 * GiB), tensor_parallel_size=1))
    assert machine_kv == 48 * GiB - weights - default_headroom(48 * GiB) and "NUMA node" not in machine_reason


def test_ranks_sharing_a_node_share_its_memory() -> None:
    """Two ranks on one node's CPUs (simulated NUMA nodes) bind their memory to that node: their weights and KV
    caches together must fit it."""
    from service.facts.model import inspect_model

    weights = inspect_model(str(MODELS / LLAMA)).weight_bytes
    hardware = _one_node(NodeMemory(40 * GiB, 30 * GiB), machine=64 * GiB)
    one = _plan(hardware, tensor_parallel_size=1)
    two = _plan(hardware, tensor_parallel_size=2, simulate_numa_nodes=2)
    assert not one.errors and not two.errors, (one.errors, two.errors)
    per_rank, reason = _kv(two)
    assert 2 * per_rank + weights <= 30 * GiB - default_headroom(40 * GiB) < 2 * _kv(one)[0] + weights
    assert "2 ranks' weights" in reason and "per rank" in reason


def test_a_node_too_small_is_a_preflight_error_naming_it() -> None:
    tight = _one_node(NodeMemory(40 * GiB, 6 * GiB), machine=64 * GiB)
    p = _plan(tight, tensor_parallel_size=1, memory_headroom_gib=1.0)
    assert p.errors and "NUMA node 0's meminfo" in p.errors[0] and "does not fit" in p.errors[0], p.errors
    asked = _plan(_one_node(NodeMemory(40 * GiB, 24 * GiB), 64 * GiB), tensor_parallel_size=1, kv_cache_gib=20)
    assert asked.errors and "kv_cache_gib=20" in asked.errors[0] and "NUMA node 0" in asked.errors[0], asked.errors
    long = _plan(_one_node(NodeMemory(40 * GiB, 24 * GiB), 64 * GiB), tensor_parallel_size=1, max_model_len=131072)
    error = long.errors[0]
    assert "NUMA node 0" in error and "a max context of" in error
    fits = int(error.split("a max context of ")[1].split()[0])
    assert 0 < fits < 131072
    assert not _plan(
        _one_node(NodeMemory(40 * GiB, 24 * GiB), 64 * GiB), tensor_parallel_size=1, max_model_len=fits
    ).errors


def test_a_two_socket_dump_sizes_each_rank_in_its_own_node() -> None:
    facts = read_hardware(sysfs_root=SYSFS / "two_socket_smt" / "sys")
    small = dataclasses.replace(facts, node_memory={0: NodeMemory(32 * GiB, None), 1: NodeMemory(256 * GiB, None)})
    p = _plan(small, tensor_parallel_size=2)
    assert not p.errors, p.errors
    per_rank, reason = _kv(p)
    from service.facts.model import inspect_model

    weights = inspect_model(str(MODELS / LLAMA)).weight_bytes
    assert per_rank + weights // 2 <= 32 * GiB - default_headroom(32 * GiB)
    assert "NUMA node 0's meminfo" in reason and "shows 32.00 GiB" in reason and "per rank" in reason
    # The arithmetic of the reason holds on the node: its total less one rank's weights and its headroom.
    on_node = (32 * GiB - weights // 2 - default_headroom(32 * GiB)) / GiB
    assert f"= {on_node:.2f} GiB available for the KV caches of 1 of 2 ranks" in reason


def test_fp32_weights_that_fit_the_machine_but_not_the_ranks_node_keep_bf16(monkeypatch) -> None:
    """The dtype's memory check is the KV cache's: an fp32 copy of the 8B model (30 GiB) fits a 64 GiB machine, not
    a node showing 24 GiB available."""
    monkeypatch.setitem(MEASUREMENTS, "avx2", Measurement("a test CPU", 0.5, 0.4, 0.6, "a test"))  # fp32 faster
    facts = read_hardware(cpuinfo_path=CPUINFO / "epyc_zen1_kvm_avx2.txt")
    topology = dataclasses.replace(facts.topology, nodes={0: facts.topology.online_cpus})
    limits = dataclasses.replace(facts.limits, memory_bytes=64 * GiB, memory_source="MemTotal")
    fp32 = dataclasses.replace(facts, topology=topology, limits=limits)
    assert _dtype(_plan(fp32, tensor_parallel_size=1)) == "float32"
    small_node = dataclasses.replace(fp32, node_memory={0: NodeMemory(40 * GiB, 24 * GiB)})
    d = next(d for d in _plan(small_node, tensor_parallel_size=1).decisions if d.setting == "engine.dtype")
    assert d.value == "bfloat16" and "fp32 weights do not fit" in d.reason


def _dtype(p) -> str:
    return p.engine_args["dtype"]
