"""The kernels' build at start (service/kernels/build_at_start.py): only where this CPU has none (or one that is not
as its build recorded it) and a source is at hand, never under build_kernels=off, and a build that fails or cannot be
loaded is said loudly and leaves the kernels unbuilt."""

from __future__ import annotations

import logging
import subprocess

from service.facts.software import NOT_BUILT
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
