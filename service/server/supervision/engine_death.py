"""Why the engine died, in words for the client, `/health` and the log: which of its processes ended, how, and
whether the kernel's out-of-memory killer did it.

vLLM answers every request of a dead engine with "EngineCore encountered an issue. See stack trace (above) for the
root cause.", and a start that failed with "Engine core initialization failed. See root cause above.": a client has
no stack trace above it, and a process killed by SIGKILL logs nothing. The cause is in the processes: vLLM's engine
manager has reaped the engine core (its exit code says how it ended), a worker that ended first is gone from the
process table, and the kernel counts the processes its out-of-memory killer killed (service/facts/oom_kills.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from service.facts.oom_kills import CGROUP, OomKills


@dataclass(frozen=True)
class OomSince:
    """What the kernel's OOM-kill count did between the engine's start and its death."""

    killed: int
    evidence: str  # e.g. "oom_kill 0 -> 1 in /sys/fs/cgroup/.../memory.events"
    scope: str  # whose processes the count counts


def oom_since(before: OomKills | None, now: OomKills | None) -> OomSince | None:
    """None where either count is unknown or they come from different files."""
    if before is None or now is None or before.source != now.source:
        return None
    return OomSince(now.count - before.count, f"oom_kill {before.count} -> {now.count} in {now.source}", now.scope)


def death_cause(engine: Any, processes: Iterable[Any], oom: OomSince | None = None) -> str:
    """The cause of a dead `engine` (vLLM's AsyncLLM), from its engine core's exit code, which of `processes`
    (psutil.Process of the engine core and workers, seen at start) are gone, and the OOM-kill count."""
    manager = engine  # vLLM's engine manager holds the engine core processes (none for an in-process engine)
    for attr in ("engine_core", "resources", "engine_manager"):
        manager = getattr(manager, attr, None)
    cores = list(getattr(manager, "processes", None) or ())
    core_pids = {core.pid for core in cores}
    exits = {core.name: core.exitcode for core in cores if core.exitcode is not None}
    gone = [proc.pid for proc in processes if proc.pid not in core_pids and not alive(proc)]
    return describe(exits, gone, oom)


def describe(core_exits: Mapping[str, int], gone_workers: Iterable[int], oom: OomSince | None = None) -> str:
    """`core_exits`: the exit code of each engine core that ended (by name; negative: the signal that killed it);
    `gone_workers`: the pids of worker processes no longer running."""
    cores = [_core(name, code, len(core_exits) > 1, oom) for name, code in core_exits.items()]
    # Workers end with a core killed by a signal: naming them says nothing more.
    workers = [] if any(code < 0 for code in core_exits.values()) else gone_workers
    what = [f"an engine worker process (pid {pid}) ended" for pid in workers] + cores
    said = any(code == -signal.SIGKILL for code in core_exits.values()) and _sigkill_says(oom)
    return "; ".join(
        (what or ["the engine core reported a fatal error (the service log has its traceback)"])
        + ([] if said else _oom_note(oom))
    )


def oom_note(oom: OomSince | None) -> str | None:
    """A sentence on OOM kills since the engine started, where there were any."""
    return next(iter(_oom_note(oom)), None)


def _oom_note(oom: OomSince | None) -> list[str]:
    if oom is None or oom.killed <= 0:
        return []
    return [f"the kernel's out-of-memory killer killed {oom.killed} process(es) of {oom.scope} ({oom.evidence})"]


def _core(name: str, code: int, several: bool, oom: OomSince | None) -> str:
    core = f"the engine core {name}" if several else "the engine core"
    if code >= 0:
        return f"{core} exited with code {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"{core} was killed by signal {-code}"
    if sig is not signal.SIGKILL:
        return f"{core} was killed by {sig.name}"
    if oom is None:
        return f"{core} was killed by SIGKILL (the kernel's out-of-memory killer sends it, or a `kill -9`)"
    if not _sigkill_says(oom):  # OOM kills elsewhere on the machine: the note after it gives the count
        return f"{core} was killed by SIGKILL"
    if oom.killed > 0:
        return f"{core} was killed by SIGKILL, by the kernel's out-of-memory killer ({oom.evidence})"
    return (
        f"{core} was killed by SIGKILL, not by the out-of-memory killer ({oom.evidence}): a `kill -9` or the container "
        "runtime"
    )


def _sigkill_says(oom: OomSince | None) -> bool:
    """Whether a SIGKILL's words can say who sent it: none were counted, or only this cgroup's processes are."""
    return oom is not None and (oom.killed <= 0 or oom.scope == CGROUP)


def alive(proc: Any) -> bool:
    """Whether the psutil.Process `proc` still runs (a zombie has ended)."""
    try:  # is_running() also checks the create time: a reused pid is not ours
        return bool(proc.is_running() and proc.status() != "zombie")
    except Exception:  # psutil.Error: gone already
        return False
