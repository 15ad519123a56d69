from __future__ import annotations

import os

from service.cache.permissions import cache_dir_problem


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
