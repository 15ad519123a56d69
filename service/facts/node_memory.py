"""sysfs -> each NUMA node's memory as its meminfo counts it: what vLLM's CPU worker checks its KV cache against.

vLLM binds a worker's memory to the NUMA node of its first CPU and refuses a KV cache larger than that node's
available memory by the node's meminfo: MemFree + Active(file) + Inactive(file) + SReclaimable
(vllm/utils/cpu_resource_utils.py, get_memory_node_info). A node can show much less than /proc/meminfo: the machine's
memory is split over its nodes, and a kernel that initializes memory lazily (deferred_init=lazy, seen on a KVM guest:
node 0 showed 10.6 of 23.5 GiB) counts a node's pages only once they were first used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KIB = 1024
# "Node 0 Active(file):     367872 kB"; the HugePages lines have no unit and are left out.
_FIELD = re.compile(r"^Node \d+ (\S+):\s+(\d+) kB$", re.MULTILINE)
AVAILABLE_FIELDS = ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")
_NODE_DIR = re.compile(r"node[0-9]+")


@dataclass(frozen=True)
class NodeMemory:
    total_bytes: int  # the node's MemTotal
    available_bytes: int | None  # vLLM's sum of AVAILABLE_FIELDS; None when not read (a recorded dump) or missing

    @property
    def usable_bytes(self) -> int:
        """What vLLM's worker would find on the node: its available memory where read, else its total."""
        return self.total_bytes if self.available_bytes is None else min(self.total_bytes, self.available_bytes)


def read_node_memory(sys_root: Path, *, available: bool) -> dict[int, NodeMemory]:
    """Node id -> its memory, for every node directory with a meminfo holding MemTotal. `available`: read what is
    free now (the live machine; a recorded dump's free memory is another moment's)."""
    nodes: dict[int, NodeMemory] = {}
    for directory in (sys_root / "devices" / "system" / "node").glob("node*"):
        meminfo = directory / "meminfo"
        if not _NODE_DIR.fullmatch(directory.name) or not meminfo.is_file():
            continue
        fields = {name: int(kib) * KIB for name, kib in _FIELD.findall(meminfo.read_text())}
        if "MemTotal" not in fields:
            continue
        free = sum(fields[f] for f in AVAILABLE_FIELDS) if all(f in fields for f in AVAILABLE_FIELDS) else None
        nodes[int(directory.name.removeprefix("node"))] = NodeMemory(fields["MemTotal"], free if available else None)
    return dict(sorted(nodes.items()))
