"""Whether the cache dir can be written, and by no one else: the service keeps the demo model, converted GGUF files,
its kernels, the calibration's timings and torch.compile's graphs there, and loads the kernels and graphs as code.
Where it could not write, the demo model's build ended in a traceback, and a GGUF file's conversion failed only
after the whole report; where another user could, that user could run code in the service."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def cache_dir_problem(cache_dir: Path) -> str | None:
    """Why `cache_dir` cannot hold the service's files (created if missing), or None."""
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache_dir):
            pass
    except OSError as exc:
        return (
            f"cache_dir {str(cache_dir)!r} is not a writable directory ({exc.strerror or exc}): the service keeps "
            "converted models, its kernels and compiled graphs there; set SERVICE_CACHE_DIR to one it may write "
            "(in a container, mount a volume there)"
        )
    return _owner_problem(Path(cache_dir))


def _owner_problem(cache_dir: Path) -> str | None:
    """Owned by the service's user or root, writable by no other user: group-writable only for the service's own
    group (Kubernetes' fsGroup volumes are root's, group-writable by the pod's group)."""
    info = cache_dir.stat()
    owners = {os.geteuid(), 0}
    why = None
    if info.st_uid not in owners:
        why = f"it belongs to uid {info.st_uid}, not the service's user ({os.geteuid()})"
    elif info.st_mode & stat.S_IWOTH:
        why = "any user may write it (mode o+w)"
    elif info.st_mode & stat.S_IWGRP and info.st_gid not in (os.getegid(), 0):
        why = f"group {info.st_gid}, not the service's ({os.getegid()}), may write it"
    if why is None:
        return None
    return (
        f"cache_dir {str(cache_dir)!r} may be changed by another user: {why}. The service loads its kernels and "
        f"compiled graphs from it as code; `chown {os.geteuid()} {cache_dir}; chmod go-w {cache_dir}`, or set "
        "SERVICE_CACHE_DIR to a directory of its own"
    )
