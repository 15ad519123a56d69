"""Why the engine died, in words for the client, `/health` and the log: which of its processes ended, and how.

vLLM answers every request of a dead engine with "EngineCore encountered an issue. See stack trace (above) for the
root cause.": a client has no stack trace above it, and the log's traceback is the API process's, not the cause.
The cause is in the processes: vLLM's engine manager has reaped the engine core (its exit code says how it ended),
and a worker that ended first is gone from the process table.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from typing import Any

# What usually sends it, so that an operator looks at memory first.
_SENDERS = {signal.SIGKILL: " (the kernel's out-of-memory killer sends it, or a `kill -9`)"}


def death_cause(engine: Any, processes: Iterable[Any]) -> str:
    """The cause of a dead `engine` (vLLM's AsyncLLM), from its engine core's exit code and which of `processes`
    (psutil.Process of the engine core and workers, seen at start) are gone."""
    manager = engine  # vLLM's engine manager holds the engine core processes (none for an in-process engine)
    for attr in ("engine_core", "resources", "engine_manager"):
        manager = getattr(manager, attr, None)
    cores = list(getattr(manager, "processes", None) or ())
    core_pids = {core.pid for core in cores}
    exits = {core.name: core.exitcode for core in cores if core.exitcode is not None}
    gone = [proc.pid for proc in processes if proc.pid not in core_pids and not alive(proc)]
    return describe(exits, gone)


def describe(core_exits: Mapping[str, int], gone_workers: Iterable[int]) -> str:
    """`core_exits`: the exit code of each engine core that ended (by name; negative: the signal that killed it);
    `gone_workers`: the pids of worker processes no longer running."""
    cores = [_core(name, code, len(core_exits) > 1) for name, code in core_exits.items()]
    if any(code < 0 for code in core_exits.values()):
        return "; ".join(cores)  # its workers end with it: naming them says nothing more
    workers = [f"an engine worker process (pid {pid}) ended" for pid in gone_workers]
    return "; ".join(workers + cores) or "the engine core reported a fatal error (the service log has its traceback)"


def _core(name: str, code: int, several: bool) -> str:
    core = f"the engine core {name}" if several else "the engine core"
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"{core} was killed by signal {-code}"
        return f"{core} was killed by {sig.name}{_SENDERS.get(sig, '')}"
    return f"{core} exited with code {code}"


def alive(proc: Any) -> bool:
    """Whether the psutil.Process `proc` still runs (a zombie has ended)."""
    try:  # is_running() also checks the create time: a reused pid is not ours
        return bool(proc.is_running() and proc.status() != "zombie")
    except Exception:  # psutil.Error: gone already
        return False
