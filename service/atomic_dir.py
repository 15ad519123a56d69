"""A directory built once: filled in a staging directory beside it and renamed into place when complete, so that a
reader never sees half of it, concurrent builders race safely (one rename wins), and a build that was killed
leaves only a staging directory, which the next build clears."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("service.atomic_dir")


def build_once(target: Path, fill: Callable[[Path], None], complete: str = "config.json") -> Path:
    """`target`, built by `fill(staging)` unless it already holds `complete` (the file a finished build has)."""
    if (target / complete).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear_leftovers(target)
    staging = target.parent / f".{target.name}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        fill(staging)
        try:
            os.rename(staging, target)
        except OSError:  # another builder finished first
            if not (target / complete).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _clear_leftovers(target: Path) -> None:
    """Staging directories of builds whose process is gone (killed mid-way)."""
    for leftover in target.parent.glob(f".{target.name}.*.partial"):
        pid = leftover.name.removeprefix(f".{target.name}.").removesuffix(".partial")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            log.info("removing %s, left by an interrupted build", leftover)
            shutil.rmtree(leftover, ignore_errors=True)
