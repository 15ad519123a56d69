"""Code in the cache runs only as the bytes its build recorded (service/cache/verified.py): each file read once,
checked, and handed over in memory, so a file swapped after the check is not what runs."""

from __future__ import annotations

import os

import pytest

from service.cache.verified import Unverified, open_verified, record, recorded_problem

NAMES = ("bin/liba.so", "lib.so")


def _build(root):
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "liba.so").write_bytes(b"first library")
    (root / "lib.so").write_bytes(b"second library")
    return record(root, NAMES)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_recorded_files_are_handed_over_in_memory_in_their_order(tmp_path):
    recorded = _build(tmp_path)
    assert recorded_problem(tmp_path, recorded, NAMES) is None
    fds = open_verified(tmp_path, recorded, NAMES)
    try:
        (tmp_path / "lib.so").write_bytes(b"swapped after the check")
        held = [open(f"/proc/self/fd/{fd}", "rb").read() for fd in fds]
        assert held == [b"first library", b"second library"]
        assert os.readlink(f"/proc/self/fd/{fds[1]}").startswith("/memfd:lib.so")
    finally:
        for fd in fds:
            os.close(fd)


def test_a_swapped_or_unrecorded_file_is_refused_and_nothing_is_left_open(tmp_path):
    recorded = _build(tmp_path)
    (tmp_path / "lib.so").write_bytes(b"a library planted in its place")
    assert "lib.so is not the file its build recorded (sha256" in recorded_problem(tmp_path, recorded, NAMES)
    before = _open_fds()
    with pytest.raises(Unverified, match="lib.so is not the file its build recorded"):
        open_verified(tmp_path, recorded, NAMES)
    with pytest.raises(Unverified, match="bin/liba.so is not in its build's record"):
        open_verified(tmp_path, {}, NAMES)
    (tmp_path / "bin" / "liba.so").unlink()
    with pytest.raises(Unverified, match="liba.so cannot be read"):
        open_verified(tmp_path, recorded, NAMES)
    assert _open_fds() == before
    assert "liba.so cannot be read" in recorded_problem(tmp_path, recorded, NAMES)
