"""How many processes the kernel's out-of-memory killer has killed, as the kernel counts them for this process.

A SIGKILL leaves no trace in the killed process's log; the kernel's counter tells an OOM kill from a `kill -9`.
The narrowest count that exists is read: this process's cgroup v2 `memory.events` (its subtree: the container),
the cgroup v1 memory controller's `memory.oom_control`, else `/proc/vmstat` (the whole machine, kernel 4.13 on).
Read while the service runs, twice: when the engine starts and when it dies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.facts.hardware import CGROUP_MOUNT, cgroup_dir, cgroup_v1_dirs
from service.facts.sysfs_value import whole_number

CGROUP, MACHINE = "this cgroup", "this machine"  # whose processes a count counts


@dataclass(frozen=True)
class OomKills:
    count: int
    source: str  # the file it was read from
    scope: str  # CGROUP or MACHINE


def read_oom_kills(cgroup_v2: Path | None, cgroup_v1_memory: Path | None, vmstat: Path) -> OomKills | None:
    """The count from the first of these files that has an `oom_kill` line; None where none has."""
    for path, scope in (
        (cgroup_v2 / "memory.events" if cgroup_v2 else None, CGROUP),
        (cgroup_v1_memory / "memory.oom_control" if cgroup_v1_memory else None, CGROUP),
        (vmstat, MACHINE),
    ):
        count = _oom_kill_line(path) if path is not None else None
        if count is not None:
            return OomKills(count, str(path), scope)
    return None


def live_oom_kills() -> OomKills | None:
    own = Path("/proc/self/cgroup").read_text()
    return read_oom_kills(
        cgroup_dir(own, CGROUP_MOUNT), cgroup_v1_dirs(own, CGROUP_MOUNT).get("memory"), Path("/proc/vmstat")
    )


def _oom_kill_line(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:  # absent (no such controller, an older kernel) or not readable
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return whole_number(path, value.strip())
    return None
