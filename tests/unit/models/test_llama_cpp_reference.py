"""llama.cpp's reference kept in a converted copy (service/models/llama_cpp_reference.py): taken once, and taken
again where it was unavailable; taken by one start at a time and written whole; taken by a child that holds no secret,
runs confined, and loads only the bindings of the image's or the checkout's source and the libraries as their build
recorded them."""

from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.cache.verified import record
from service.facts.software import BUILT_FILES, GGML_KERNEL_DIR, ggml_kernel_problem
from service.models import llama_cpp_reference
from service.models.llama_cpp_reference import (
    MEMORY_BEYOND_FILE,
    MEMORY_PER_THREAD,
    REFERENCE,
    SPARE_TASKS,
    ensure_reference,
    run_child,
)

REPO = Path(__file__).resolve().parents[3]
SCORES = {"text": "t", "tokens": [1, 2], "logprobs": [-1.0], "top": [2]}


def test_a_kept_reference_is_read_not_taken_again(tmp_path):
    (tmp_path / REFERENCE).write_text(json.dumps(SCORES))
    assert ensure_reference(tmp_path / "absent.gguf", tmp_path) == SCORES


def test_an_unavailable_reference_is_taken_again_and_says_why(tmp_path):
    (tmp_path / REFERENCE).write_text(json.dumps({"unavailable": "an earlier start had no llama.cpp"}))
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a GGUF file")
    result = ensure_reference(not_gguf, tmp_path)
    # Whatever this checkout has (llama.cpp built or not), this start tried again and said why it could not score.
    assert result["unavailable"] != "an earlier start had no llama.cpp"
    assert json.loads((tmp_path / REFERENCE).read_text()) == result


# --- one writer at a time, whole files (finding 7) -------------------------------------------------------------------


def _lock_held(path: Path) -> bool:
    with open(path.parent / f".{path.name}.lock", "a+b") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def test_the_reference_is_written_whole_under_the_lock_by_a_name_no_other_pid_1_shares(tmp_path, monkeypatch):
    """Every replica is pid 1 of its own namespace: a staging name by pid was the same file for all of them."""
    path = tmp_path / REFERENCE
    replaced = []
    real_replace = os.replace

    def replace(source, target):
        replaced.append((Path(source).name, Path(target), _lock_held(path)))
        real_replace(source, target)

    monkeypatch.setattr(os, "getpid", lambda: 1)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(llama_cpp_reference, "_score", lambda gguf: SCORES if _lock_held(path) else {})
    assert ensure_reference(tmp_path / "model.gguf", tmp_path) == SCORES
    ((staged, target, held),) = replaced
    assert target == path and held, "written under the lock the scoring held"
    assert staged.startswith(f".{REFERENCE}.") and not staged.endswith(".1") and staged.count(".") >= 4
    assert json.loads(path.read_text()) == SCORES
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([REFERENCE, f".{REFERENCE}.lock"])


def _take(converted: str, scores: dict, started, release, out) -> None:
    def score(gguf: Path) -> dict:
        started.set()
        release.wait(30)
        return scores

    llama_cpp_reference._score = score
    out.put(ensure_reference(Path(converted) / "model.gguf", Path(converted)))


def test_a_start_that_waited_reads_the_reference_taken_meanwhile(tmp_path):
    context = multiprocessing.get_context("spawn")
    first_started, second_started, release = context.Event(), context.Event(), context.Event()
    out = context.Queue()
    first = context.Process(target=_take, args=(str(tmp_path), SCORES, first_started, release, out))
    second = context.Process(target=_take, args=(str(tmp_path), {"text": "second"}, second_started, release, out))
    try:
        first.start()
        assert first_started.wait(60)
        second.start()
        assert not second_started.wait(1), "the second start waits for the first's reference, not scores beside it"
        release.set()
        results = [out.get(timeout=60), out.get(timeout=60)]
    finally:
        release.set()
        for process in (first, second):
            process.join(30)
            process.kill()
    assert results == [SCORES, SCORES] and not second_started.is_set()
    assert json.loads((tmp_path / REFERENCE).read_text()) == SCORES


# --- the child holds no secret and runs confined (finding 2) ---------------------------------------------------------

SECRETS = {
    "HF_TOKEN": "hf-token-value",
    "SERVICE_API_KEY": "service-key-value",
    "SERVICE_API_KEY_FILE": "/run/secrets/service-key-file",
    "HTTPS_PROXY": "http://user:proxy-password@proxy:3128",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
}


def test_the_child_sees_no_secret_and_runs_confined(tmp_path, monkeypatch, caplog):
    """The child is started as llama.cpp's is (run_child), with a probe in its place that reports what it was given."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setattr(llama_cpp_reference, "CHILD", "tests.unit.models.llama_cpp_child_probe")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" * 1000)
    libraries = tmp_path / "libraries"
    libraries.mkdir()
    fd = os.memfd_create("libllama.so")
    os.write(fd, b"the recorded bytes")
    (libraries / "libllama.so").symlink_to(f"/proc/self/fd/{fd}")
    try:
        with caplog.at_level(logging.INFO, logger="service.gguf"):
            seen = run_child(gguf, tmp_path / "llama_cpp.py", libraries, [fd])
    finally:
        os.close(fd)
    environ = seen["environ"]
    assert [name for name in environ if name in SECRETS or name.startswith("SERVICE_")] == [
        "SERVICE_LLAMA_CPP_BINDINGS"
    ]
    assert not [v for v in environ.values() if any(secret in v for secret in SECRETS.values())]
    assert environ["LC_ALL"] == "C.UTF-8" and environ["LLAMA_CPP_LIB_PATH"] == str(libraries)
    assert seen["links"] == {"libllama.so": "the recorded bytes"}, "the memfd is the child's, through the link"
    limits = seen["limits"]
    assert limits["RLIMIT_FSIZE"] == [0, 0] and limits["RLIMIT_CORE"] == [0, 0]
    threads = len(os.sched_getaffinity(0))
    assert limits["RLIMIT_DATA"][1] <= gguf.stat().st_size + MEMORY_BEYOND_FILE + threads * MEMORY_PER_THREAD
    assert seen["no_new_privs"] == "1"
    if "refused it namespaces of its own" not in caplog.text:  # where the kernel allows it: no network, few tasks
        assert seen["net"] != os.readlink("/proc/self/ns/net")
        assert limits["RLIMIT_NPROC"][1] <= threads + SPARE_TASKS


def test_tasks_are_limited_only_where_the_kernel_counts_them_per_namespace():
    counted_apart = llama_cpp_reference._tasks_counted_per_namespace
    assert counted_apart("5.14.0-1-generic") and counted_apart("6.18.44-fc-v1252")
    assert not counted_apart("5.4.0-150-generic") and not counted_apart("4.18.0-553.el8_10.x86_64")


# --- only the image's or the checkout's bindings, only recorded libraries (finding 3) --------------------------------

needs_kernels = pytest.mark.skipif(
    ggml_kernel_problem() is not None, reason=f"the kernels are not built here: {ggml_kernel_problem()}"
)


def _copy_of_the_build(kernels: Path, **stamp: object) -> Path:
    """This CPU's recorded build, copied under `kernels` (a SERVICE_GGML_KERNEL_DIR), with `stamp` added to its
    record's stamp."""
    copy = kernels / GGML_KERNEL_DIR.name
    for name in BUILT_FILES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(GGML_KERNEL_DIR / name, copy / name)
    built = {"built_from": "a copy", "files": record(copy, BUILT_FILES), **stamp}
    (copy / "kernel" / "built.json").write_text(json.dumps(built))
    return copy


def _reference_in_a_process(kernels: Path, tmp_path: Path) -> dict:
    """ensure_reference on a file that is no GGUF, in a service process whose kernels are under `kernels`."""
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a GGUF file")
    (tmp_path / "converted").mkdir()
    env = {**os.environ, "SERVICE_GGML_KERNEL_DIR": str(kernels)}
    env.pop("SERVICE_KERNEL_SOURCE", None)  # the checkout's source
    code = (
        "import json, sys; from pathlib import Path; from service.models.llama_cpp_reference import ensure_reference; "
        "print(json.dumps(ensure_reference(Path(sys.argv[1]), Path(sys.argv[2]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(not_gguf), str(tmp_path / "converted")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout)


@needs_kernels
def test_bindings_a_stamp_in_the_cache_points_at_never_run(tmp_path):
    marker = tmp_path / "planted-bindings-ran"
    planted = tmp_path / "planted"
    (planted / "vendor" / "llama.cpp").mkdir(parents=True)
    (planted / "vendor" / "llama.cpp" / "CMakeLists.txt").write_text("\n")
    (planted / "llama_cpp").mkdir()
    (planted / "llama_cpp" / "llama_cpp.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    _copy_of_the_build(tmp_path / "kernels", tree=str(planted / "vendor" / "llama.cpp"))
    result = _reference_in_a_process(tmp_path / "kernels", tmp_path)
    assert not marker.exists()
    # The checkout's bindings ran llama.cpp in the child, which refused the file.
    assert "could not load" in result["unavailable"], result


@needs_kernels
def test_a_swapped_library_is_refused_not_loaded(tmp_path):
    copy = _copy_of_the_build(tmp_path / "kernels")
    shutil.copyfile(copy / "build/bin/libggml.so", copy / "build/bin/libllama.so")  # a valid library, not the one
    result = _reference_in_a_process(tmp_path / "kernels", tmp_path)
    assert "libllama.so is not the file its build recorded" in result["unavailable"], result
    assert "could not load" not in result["unavailable"], "no child ran"
