"""The kernels' build records each library's sha256 (service/kernels/ggml_build.py), and nothing differing from the
record is reported as built (service/facts/software.py) or loaded (service/kernels/ggml_linear.py): the libraries are
code in a cache replicas share."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.cache.verified import record
from service.facts.software import (
    BUILT_FILES,
    CHECKOUT_SOURCE,
    GGML_KERNEL_DIR,
    LLAMA_CPP_VERSION,
    NOT_BUILT,
    UNRECORDED,
    ggml_kernel_built,
    ggml_kernel_problem,
)

REPO = Path(__file__).resolve().parents[3]


def _build(kernel_dir: Path) -> Path:
    for name in BUILT_FILES:
        (kernel_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (kernel_dir / name).write_bytes(f"library {name}".encode())
    stamp = kernel_dir / "kernel" / "built.json"
    stamp.write_text(json.dumps({"built_from": "ggml from a test", "files": record(kernel_dir, BUILT_FILES)}))
    return stamp


def test_a_build_is_reported_built_only_as_it_recorded_itself(tmp_path):
    stamp = tmp_path / "cpu" / "kernel" / "built.json"
    assert ggml_kernel_problem(stamp) == NOT_BUILT and ggml_kernel_built(stamp) is None
    _build(tmp_path / "cpu")
    assert ggml_kernel_problem(stamp) is None and ggml_kernel_built(stamp) == "ggml from a test"
    planted = tmp_path / "cpu" / "build" / "bin" / "libggml-cpu.so"
    planted.write_bytes(b"another library")
    assert f"{planted} is not the file its build recorded" in ggml_kernel_problem(stamp)
    assert ggml_kernel_built(stamp) is None
    # A stamp of before the record (it named its library and tree): rebuilt, not trusted.
    stamp.write_text(json.dumps({"built_from": "ggml", "library": str(planted), "tree": "/src/llama.cpp"}))
    assert ggml_kernel_problem(stamp) == UNRECORDED and ggml_kernel_built(stamp) is None


@pytest.mark.skipif(not (REPO / "mk").is_dir(), reason="mk/ is not in this build context (the test image)")
def test_the_checkout_source_is_the_one_make_extracts():
    variables = dict(re.findall(r"^(\w+) := (\S+)$", (REPO / "mk/bench.mk").read_text(), re.M))
    assert variables["LLAMA_CPP_VERSION"] == LLAMA_CPP_VERSION
    tree = re.sub(r"\$\((\w+)\)", lambda used: variables[used[1]], variables["LLAMA_CPP_TREE"])
    assert CHECKOUT_SOURCE == REPO / tree / "vendor" / "llama.cpp"


def _load_in_a_process(kernels: Path) -> subprocess.CompletedProcess:
    """The op library loaded by a process whose kernels are under `kernels`; it prints the files it maps there."""
    code = (
        "import torch; from service.kernels.ggml_linear import load_library; load_library(); "
        "print(hasattr(torch.ops.service_ggml, 'linear')); "
        f"print([line for line in open('/proc/self/maps') if {str(kernels)!r} in line])"
    )
    env = {"PATH": "/usr/bin:/bin", "SERVICE_GGML_KERNEL_DIR": str(kernels)}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(ggml_kernel_problem() is not None, reason=f"the kernels are not built: {ggml_kernel_problem()}")
def test_the_op_library_loads_as_recorded_and_a_swapped_one_is_refused(tmp_path):
    copy = tmp_path / "kernels" / GGML_KERNEL_DIR.name
    for name in BUILT_FILES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(GGML_KERNEL_DIR / name, copy / name)
    (copy / "kernel" / "built.json").write_text(
        json.dumps({"built_from": "a copy", "files": record(copy, BUILT_FILES)})
    )
    loaded = _load_in_a_process(tmp_path / "kernels")
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    # Registered, from memory: not one file of the cache is mapped, so none can change under the process.
    assert loaded.stdout.split("\n")[:2] == ["True", "[]"]
    swapped = copy / "kernel" / "service_ggml_linear.so"
    shutil.copyfile(copy / "build/bin/libggml.so", swapped)  # a valid library, not the recorded one
    refused = _load_in_a_process(tmp_path / "kernels")
    assert refused.returncode != 0
    assert f"the service's kernels cannot be loaded: {swapped} is not the file its build recorded" in refused.stderr
    assert "make kernels" in refused.stderr
