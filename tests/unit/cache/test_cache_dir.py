from __future__ import annotations

import os

from service.cache.permissions import cache_dir_problem, code_dirs


def test_a_missing_cache_dir_is_created(tmp_path):
    cache = tmp_path / "a" / "b"
    assert cache_dir_problem(cache) is None
    assert cache.is_dir() and not any(cache.iterdir())  # the probe leaves nothing behind


def test_a_cache_dir_under_a_file_is_named_with_the_reason(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    problem = cache_dir_problem(blocker / "cache")
    assert problem is not None
    assert str(blocker / "cache") in problem and "Not a directory" in problem and "SERVICE_CACHE_DIR" in problem


def test_a_cache_dir_that_is_a_file_is_named(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    problem = cache_dir_problem(file)
    assert problem is not None and "not a writable directory" in problem


def test_a_cache_dir_another_user_may_write_is_refused(tmp_path):
    """Its kernels and compiled graphs are loaded as code."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    assert cache_dir_problem(cache) is None
    cache.chmod(0o777)
    assert "any user may write it" in cache_dir_problem(cache)
    cache.chmod(0o775)  # group-writable by the service's own group: Kubernetes' fsGroup volumes are
    assert cache_dir_problem(cache) is None
    if os.geteuid() == 0:  # CI runs as root: another owner and another group can be set
        cache.chmod(0o755)
        os.chown(cache, 12345, 12345)
        assert "belongs to uid 12345" in cache_dir_problem(cache)
        os.chown(cache, 0, 12345)
        cache.chmod(0o775)
        assert "group 12345" in cache_dir_problem(cache)
        cache.chmod(0o755)
        assert cache_dir_problem(cache) is None


def test_a_folder_beneath_the_cache_dir_another_user_may_write_is_refused(tmp_path):
    """The kernels and compiled graphs are loaded from folders beneath it: checking the top one alone let a folder
    on the way to a library be replaced."""
    cache = tmp_path / "cache"
    bin_dir = cache / "kernels" / "cpu" / "build" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "libggml.so").write_bytes(b"\x7fELF")
    assert cache_dir_problem(cache) is None
    bin_dir.chmod(0o777)
    problem = cache_dir_problem(cache)
    assert problem is not None and problem.startswith(f"{bin_dir} may be changed by another user: any user may write")
    assert f"chmod -R go-w {cache}" in problem and "SERVICE_CACHE_DIR" in problem
    bin_dir.chmod(0o755)
    (bin_dir / "libggml.so").chmod(0o666)  # a file as well as its folder
    assert cache_dir_problem(cache).startswith(f"{bin_dir / 'libggml.so'} may be changed by another user")


def test_the_folders_code_is_loaded_from_outside_the_cache_dir_are_checked(tmp_path):
    """The Kubernetes manifest puts Inductor's cache beside the service's cache dir, not in it."""
    cache, kernels, inductor, vllm = (tmp_path / name for name in ("cache", "kernels", "inductor", "vllm"))
    for folder in (kernels, inductor, vllm):
        folder.mkdir(mode=0o755)
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(inductor), "VLLM_CACHE_ROOT": str(vllm), "HF_HOME": str(tmp_path)}
    elsewhere = code_dirs(kernels, environ)
    assert elsewhere == {
        "SERVICE_GGML_KERNEL_DIR": kernels,
        "TORCHINDUCTOR_CACHE_DIR": inductor,
        "VLLM_CACHE_ROOT": vllm,
    }
    assert code_dirs(kernels, {}) == {"SERVICE_GGML_KERNEL_DIR": kernels}
    assert cache_dir_problem(cache, elsewhere) is None
    for variable, folder in elsewhere.items():
        (folder / "sub").mkdir()
        (folder / "sub").chmod(0o777)
        problem = cache_dir_problem(cache, elsewhere)
        assert problem is not None and problem.startswith(f"{folder / 'sub'} may be changed by another user")
        assert f"set {variable} to a directory of its own" in problem
        (folder / "sub").chmod(0o755)
    assert cache_dir_problem(cache, elsewhere) is None


def test_a_folder_above_them_counts_unless_it_is_sticky(tmp_path):
    """Whoever may write a folder above may rename the service's away and put another in its place; in a sticky
    folder (/tmp) others may only add their own entries."""
    above = tmp_path / "shared"
    cache = above / "cache"
    cache.mkdir(parents=True)
    above.chmod(0o777)
    problem = cache_dir_problem(cache)
    assert problem is not None and problem.startswith(f"{above} may be changed by another user")
    assert f"chmod go-w {above}`" in problem and "-R" not in problem
    above.chmod(0o1777)
    assert cache_dir_problem(cache) is None
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o777)
    open_folder.chmod(0o777)
    missing = open_folder / "kernels"  # made later, in a folder that is judged now
    assert cache_dir_problem(cache, {"SERVICE_GGML_KERNEL_DIR": missing}).startswith(f"{open_folder} may be changed")
