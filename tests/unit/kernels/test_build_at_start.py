"""The kernels' build at start (service/kernels/build_at_start.py): only where this CPU has none (or one that is not
as its build recorded it) and a source is at hand, never under build_kernels=off, and a build that fails or cannot be
loaded is said loudly and leaves the kernels unbuilt."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess

from service.cache.verified import record
from service.facts.software import BUILT_FILES, NOT_BUILT, ggml_kernel_problem
from service.kernels import build_at_start as build_at_start_module
from service.kernels.build_at_start import AT_START, build_at_start, built_from

SWAPPED = "/cache/kernels/cpu/build/bin/libggml-cpu.so is not the file its build recorded"


def _never_built() -> str:
    return NOT_BUILT


def test_nothing_is_built_where_the_kernels_are_or_nothing_to_build_from(tmp_path):
    source = tmp_path / "llama.cpp"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("this would fail if it were built\n")
    assert build_at_start("auto", source, lambda: None, tmp_path / "k" / "cpu") is None
    assert build_at_start("auto", None, _never_built, tmp_path / "k" / "cpu") is None
    assert build_at_start("auto", tmp_path / "missing", _never_built, tmp_path / "k" / "cpu") is None
    said = build_at_start("off", source, _never_built, tmp_path / "k" / "cpu")
    assert said is not None and "build_kernels=off" in said
    assert not (tmp_path / "k").exists()


def test_a_failed_build_is_said_loudly_and_leaves_no_kernels(tmp_path, caplog):
    source = tmp_path / "llama.cpp"
    source.mkdir()
    (source / "CMakeLists.txt").write_text('message(FATAL_ERROR "no ggml in this tree")\n')
    with caplog.at_level(logging.INFO, logger="service.kernels"):
        said = build_at_start("auto", source, _never_built, tmp_path / "k" / "cpu")
    assert said is not None and "failed, vLLM's kernels run instead" in said
    assert "no ggml in this tree" in said
    # Said once, as an error (the start's other lines are the build's announcement).
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage() == said] == [(logging.ERROR, said)]
    assert not (tmp_path / "k" / "cpu" / "kernel" / "built.json").exists()


def test_a_build_says_what_it_was_built_from(tmp_path):
    sdist = tmp_path / "llama-cpp-python"
    (sdist / "vendor" / "llama.cpp").mkdir(parents=True)
    (sdist / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.36\n\nlong text\n")
    assert built_from(sdist / "vendor" / "llama.cpp") == f"ggml from llama_cpp_python 0.3.36, {AT_START}"
    assert built_from(tmp_path / "tree") == f"ggml from {tmp_path / 'tree'}, {AT_START}"


def test_a_build_that_differs_from_its_record_is_said_loudly_and_rebuilt_where_it_can_be(tmp_path, caplog, monkeypatch):
    with caplog.at_level(logging.INFO, logger="service.kernels"):
        said = build_at_start("auto", None, lambda: SWAPPED, tmp_path / "k" / "cpu")
    assert said is not None and SWAPPED in said and "vLLM's kernels run instead" in said and "make kernels" in said
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    source = tmp_path / "llama.cpp"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("\n")
    builds = []

    def build(command, **kwargs):
        builds.append(command)
        raise subprocess.CalledProcessError(1, command, stderr="stopped by the test")

    monkeypatch.setattr(build_at_start_module.subprocess, "run", build)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="service.kernels"):
        said = build_at_start("auto", source, lambda: SWAPPED, tmp_path / "k" / "cpu")
    assert [command[2:4] for command in builds] == [["service.kernels.ggml_build", str(source)]]
    assert said is not None and "stopped by the test" in said
    assert any(r.levelno == logging.ERROR and SWAPPED in r.getMessage() for r in caplog.records)


def _shipped_build(root, built_from: str = "ggml from llama_cpp_python 0.3.36, built with the image"):
    """A build as the image's kernels stage leaves it: the recorded libraries and their record, nothing else."""
    for name in BUILT_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(f"library {name}".encode())
    stamp = {"built_from": built_from, "files": record(root, BUILT_FILES)}
    (root / "kernel" / "built.json").write_text(json.dumps(stamp))
    return root


def test_the_images_build_for_these_cpu_flags_is_copied_instead_of_built(tmp_path, monkeypatch, caplog):
    source = tmp_path / "llama.cpp"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("\n")
    shipped = tmp_path / "opt" / "service-kernels"
    _shipped_build(shipped / "flagskey")
    builds = []

    def build(command, **kwargs):
        builds.append(command)
        raise subprocess.CalledProcessError(1, command, stderr="built instead")

    monkeypatch.setattr(build_at_start_module.subprocess, "run", build)
    kernel_dir = tmp_path / "cache" / "kernels" / "flagskey"

    def problem() -> str | None:
        return ggml_kernel_problem(kernel_dir / "kernel" / "built.json")

    with caplog.at_level(logging.INFO, logger="service.kernels"):
        said = build_at_start("auto", source, problem, kernel_dir, shipped)
    assert said is not None and said.startswith("copied the service's kernels the image was built with"), said
    assert not builds and problem() is None
    assert json.loads((kernel_dir / "kernel" / "built.json").read_text())["built_from"].endswith("built with the image")
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    # Nothing for these flags, or a copy that is not its record: built, as without an image build.
    for flags in ("otherkey", "flagskey"):
        shutil.rmtree(tmp_path / "cache")
        kernel_dir = tmp_path / "cache" / "kernels" / flags
        said = build_at_start("auto", source, problem, kernel_dir, shipped)
        assert said is not None and "built instead" in said, said
        (shipped / "flagskey" / BUILT_FILES[0]).write_bytes(b"swapped")
    assert len(builds) == 2 and not (kernel_dir / "kernel" / "built.json").exists()
