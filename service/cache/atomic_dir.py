"""A directory built once in a cache that replicas share (a ReadWriteMany volume, every replica's service pid 1 of
its own pid namespace): built under an advisory lock on the target, in a staging directory beside it whose name is
unique across hosts and pid namespaces, renamed into place when complete with a manifest of each file's size and
sha256. A reader never sees half of it; a second builder waits for the first and then uses its result; a staging
directory found while holding the lock is a killed build's (a live builder would hold the lock), and is cleared; a
finished directory whose files no longer match their manifest's sizes is rebuilt, never served. Staging by pid
let one pod's build delete another's live staging directory and mix their shards."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from service.cache.verified import file_sha256

log = logging.getLogger("service.cache.atomic_dir")

MANIFEST = ".manifest.json"  # {relative path: [size, sha256]} of every file a finished build holds


def unique_name(prefix: str, suffix: str = "") -> str:
    """`prefix.<host>.<random>suffix`: no two builders pick the same one, whatever their pids."""
    return f"{prefix}.{socket.gethostname()}.{secrets.token_hex(6)}{suffix}"


def replace_file(path: Path, data: bytes) -> None:
    """`path` holds `data`, written beside it under a unique name and renamed into place (a writer cut short leaves
    no half-written file; concurrent writers of the same data race safely)."""
    staging = path.with_name(unique_name(f".{path.name}"))
    try:
        staging.write_bytes(data)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(target: Path) -> Iterator[None]:
    """An exclusive advisory lock on `target`, held through a lock file beside it (flock: released by the kernel
    when its holder dies, and shared through NFS as a POSIX lock)."""
    with open(target.parent / f".{target.name}.lock", "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another build of %s (another start on this cache)", target)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_once(target: Path, fill: Callable[[Path], None], complete: str = "config.json") -> bool:
    """`target` built by `fill(staging)` unless it already holds `complete` (the file a finished build has) and
    every file of its manifest at its size. True when this call built it, False when it was there or another builder
    finished it while this one waited."""
    if finished_problem(target, complete) is None:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target):
        problem = finished_problem(target, complete)
        if problem is None:  # another builder finished while this one waited
            return False
        if target.exists():
            log.warning("rebuilding %s: %s", target, problem)
            _remove(target)
        _clear_leftovers(target)
        staging = target.parent / unique_name(f".{target.name}", ".partial")
        staging.mkdir()
        try:
            fill(staging)
            _write_manifest(staging)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return True


def finished_problem(target: Path, complete: str) -> str | None:
    """Why `target` is not a finished build to serve (None: it is). Sizes only: cheap on every start."""
    if not (target / complete).is_file():
        return f"no {complete}" if target.exists() else "not built"
    try:
        manifest = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return f"no readable {MANIFEST} (built before builds recorded one, or damaged)"
    for name, (size, _sha256) in manifest.items():
        try:
            found = (target / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if found != size:
            return f"{name} holds {found} bytes, its build wrote {size}"
    return None


def _write_manifest(staging: Path) -> None:
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    manifest = {p.relative_to(staging).as_posix(): [p.stat().st_size, file_sha256(p)] for p in files}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _remove(path: Path) -> None:
    """Out of the way first (a rename), then deleted: a reader that opened its files keeps them."""
    aside = path.parent / unique_name(f".{path.name}", ".stale")
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _clear_leftovers(target: Path) -> None:
    """Staging directories of builds killed mid-way, and stale copies whose removal was cut short: with the lock
    held, no live build owns one."""
    for suffix in (".partial", ".stale"):
        for leftover in target.parent.glob(f".{target.name}.*{suffix}"):
            log.info("removing %s, left by an interrupted build", leftover)
            shutil.rmtree(leftover, ignore_errors=True)
