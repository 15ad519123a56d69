"""Builds into a cache replicas share (service/cache/atomic_dir.py): one builder at a time per target, staging names no
two builders share, killed builds cleared by their lock (not by a pid another pid namespace reuses), and a finished
build whose files changed size rebuilt, never served."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from service.cache.atomic_dir import MANIFEST, build_once, finished_problem, locked, replace_file, unique_name


def _fill(text: str):
    def fill(staging: Path) -> None:
        (staging / "model.safetensors").write_text(text)
        (staging / "config.json").write_text("{}")

    return fill


def test_a_build_records_each_files_size_and_hash(tmp_path):
    target = tmp_path / "m"
    assert build_once(target, _fill("weights")) is True and build_once(target, _fill("again")) is False
    manifest = json.loads((target / MANIFEST).read_text())
    assert manifest["model.safetensors"][0] == len("weights") and len(manifest["model.safetensors"][1]) == 64
    assert finished_problem(target, "config.json") is None
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith((".partial", ".stale"))] == []


def test_a_finished_build_whose_file_changed_size_is_rebuilt_not_served(tmp_path):
    target = tmp_path / "m"
    build_once(target, _fill("weights"))
    (target / "model.safetensors").write_text("cut")
    assert "3 bytes, its build wrote 7" in finished_problem(target, "config.json")
    calls = []
    build_once(target, lambda staging: (calls.append(1), _fill("weights")(staging)))
    assert calls == [1] and (target / "model.safetensors").read_text() == "weights"
    (target / "model.safetensors").unlink()
    assert "missing" in finished_problem(target, "config.json")
    (target / MANIFEST).unlink()
    assert MANIFEST in finished_problem(target, "config.json")  # a build of before the manifests: rebuilt


def test_staging_names_are_unique_whatever_the_pid():
    names = {unique_name(".m", ".partial") for _ in range(1000)}
    assert len(names) == 1000 and all(str(os.getpid()) not in n.split(".")[2:] for n in names)


def _build_second(target: str) -> None:
    build_once(Path(target), _fill("second"))


def _hold(target: str, held, release) -> None:
    def fill(staging: Path) -> None:
        (staging / "model.safetensors").write_text("first")
        held.set()
        release.wait(30)
        (staging / "config.json").write_text("{}")

    build_once(Path(target), fill)


def test_a_second_builder_waits_for_the_first_and_uses_its_build(tmp_path):
    """The first builder held mid-way: the second neither clears its staging nor builds beside it."""
    context = multiprocessing.get_context("spawn")
    held, release = context.Event(), context.Event()
    first = context.Process(target=_hold, args=(str(tmp_path / "m"), held, release))
    first.start()
    try:
        assert held.wait(60)
        (staging,) = tmp_path.glob(".m.*.partial")
        second = context.Process(target=_build_second, args=(str(tmp_path / "m"),))
        second.start()
        time.sleep(1.0)
        assert second.is_alive() and staging.is_dir(), "the second build waits on the lock, leaving the first's"
        release.set()
        first.join(60)
        second.join(60)
    finally:
        release.set()
        first.kill()
    assert (tmp_path / "m" / "model.safetensors").read_text() == "first"
    assert finished_problem(tmp_path / "m", "config.json") is None
    assert not list(tmp_path.glob(".m.*.partial"))


def test_a_killed_builds_staging_is_cleared_by_the_next_build_once_its_lock_is_free(tmp_path):
    context = multiprocessing.get_context("spawn")
    held, release = context.Event(), context.Event()
    killed = context.Process(target=_hold, args=(str(tmp_path / "m"), held, release))
    killed.start()
    assert held.wait(60)
    killed.kill()
    killed.join(30)
    assert len(list(tmp_path.glob(".m.*.partial"))) == 1  # as a SIGKILL or an OOM kill leaves it
    build_once(tmp_path / "m", _fill("next"))
    assert not list(tmp_path.glob(".m.*.partial")) and (tmp_path / "m" / "model.safetensors").read_text() == "next"


def test_the_lock_excludes_across_open_files(tmp_path):
    """flock is per open file: a second opener (another process, or this one) waits."""
    import fcntl

    (tmp_path / "m").mkdir()
    with locked(tmp_path / "m"):
        with open(tmp_path / ".m.lock", "a+b") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_file_replaced_in_place_leaves_no_staging(tmp_path):
    replace_file(tmp_path / "facts.json", b"{}")
    replace_file(tmp_path / "facts.json", b"[]")
    assert [p.name for p in tmp_path.iterdir()] == ["facts.json"] and (tmp_path / "facts.json").read_bytes() == b"[]"
