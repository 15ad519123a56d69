"""Files in the cache the service runs as code (its kernels' libraries, llama.cpp's): recorded with their sha256 by the
build that wrote them, and run only as bytes that match the record. A loader reads each file once, checks it, and maps
a copy held in memory (a memfd), so a file changed between the check and the load is not what runs.

The record sits in the same cache as the files: it tells a build's own files from damaged, half-written or swapped
ones, and it is as trustworthy as whoever may write the cache, which the start's permission check (permissions.py)
narrows to the service's user."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path


class Unverified(RuntimeError):
    """A recorded file that is missing, unrecorded, or not the bytes its build recorded."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def record(root: Path, names: Iterable[str]) -> dict[str, str]:
    """{name: sha256} of the files `names` (relative to `root`), as a build writes it beside them."""
    return {name: file_sha256(root / name) for name in names}


def recorded_problem(root: Path, recorded: Mapping[str, object], names: Iterable[str]) -> str | None:
    """Why the files `names` under `root` are not the ones `recorded` (None: each is)."""
    for name in names:
        try:
            found = file_sha256(root / name)
        except OSError as exc:
            return f"{root / name} cannot be read ({exc.strerror or exc})"
        if (why := _mismatch(root, name, recorded, found)) is not None:
            return why
    return None


def open_verified(root: Path, recorded: Mapping[str, object], names: Iterable[str]) -> list[int]:
    """A memfd per file of `names`, in that order, holding the bytes read from `root` once they matched `recorded`;
    the caller maps them (`/proc/self/fd/<fd>`) and closes them. Raises Unverified, leaving none open."""
    opened: list[int] = []
    try:
        for name in names:
            try:
                data = (root / name).read_bytes()
            except OSError as exc:
                raise Unverified(f"{root / name} cannot be read ({exc.strerror or exc})") from exc
            if (why := _mismatch(root, name, recorded, hashlib.sha256(data).hexdigest())) is not None:
                raise Unverified(why)
            opened.append(_in_memory(Path(name).name, data))
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    return opened


def _mismatch(root: Path, name: str, recorded: Mapping[str, object], found: str) -> str | None:
    if name not in recorded:
        return f"{root / name} is not in its build's record"
    if recorded[name] != found:
        return f"{root / name} is not the file its build recorded (sha256 {found}, recorded {recorded[name]})"
    return None


def _in_memory(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return fd
