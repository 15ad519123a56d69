"""The service's own process gets the preload decided for the engine (service/policy/machine/preload.py): the process
executes itself once more with it, because LD_PRELOAD acts only when a process starts.

Why: under load at c=16, glibc's malloc and free took 7.7-8.8% of the API process's CPU cycles (perf) against
tcmalloc's 2.6-3.4% in vLLM's own server, whose API process the same variable preloads (docs/benchmarks.md).
The re-executed process keeps its pid (exec), arguments and environment; the user's own LD_PRELOAD travels beside it
in REEXEC_ENV so the policy decides from what the user set, not from the last start.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

log = logging.getLogger("service")
REEXEC_ENV = "SERVICE_PRELOAD_REEXEC"  # present only in the re-executed process: the user's LD_PRELOAD ("" if none)


def restore_user_preload(environ: MutableMapping[str, str]) -> bool:
    """In the re-executed process, put the user's LD_PRELOAD back where the policy reads it. Whether this process
    is the re-executed one."""
    if REEXEC_ENV not in environ:
        return False
    user_value = environ.pop(REEXEC_ENV)
    if user_value:
        environ["LD_PRELOAD"] = user_value
    else:
        environ.pop("LD_PRELOAD", None)
    return True


def missing_from(decided: str | None, mapped: set[str]) -> list[str]:
    """The decided libraries (LD_PRELOAD syntax) that are not mapped in a process with these mapped files."""
    return [lib for lib in (decided or "").split(":") if lib and os.path.realpath(lib) not in mapped]


def mapped_files(maps: str) -> set[str]:
    """The files of a /proc/<pid>/maps text."""
    return {parts[5] for line in maps.splitlines() if len(parts := line.split(None, 5)) == 6}


def reexec_environ(environ: Mapping[str, str], user_value: str | None) -> dict[str, str]:
    """The environment to execute again with: `environ` (holding the decided LD_PRELOAD) and the user's own beside it."""
    return {**environ, REEXEC_ENV: user_value or ""}


def reexec_argv(executable: str, argv: Sequence[str]) -> list[str]:
    """The same arguments as `python -m service`, through the same interpreter, however this process was started."""
    return [executable, "-m", "service", *argv[1:]]


def preload_self(decided: str | None, user_preload: str | None, reexecuted: bool) -> None:
    """Execute this process again with the engine's preload, unless it is loaded here already
    (service/startup/self_preload.py)."""
    missing = missing_from(decided, mapped_files(Path("/proc/self/maps").read_text()))
    if not missing:
        return
    if reexecuted:
        log.warning("the service's own process did not load %s; its engine processes get them", ", ".join(missing))
        return
    log.info("executing the service again with LD_PRELOAD=%s: its own process allocates with it too", decided)
    sys.stdout.flush()
    sys.stderr.flush()
    env = reexec_environ({**os.environ, "LD_PRELOAD": decided or ""}, user_preload)
    os.execve(sys.executable, reexec_argv(sys.executable, sys.argv), env)
