from __future__ import annotations

from service.cache_dir import cache_dir_problem


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
