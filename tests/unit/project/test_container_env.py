"""scripts/container/env.sh: the container tests' storage lies beside the service's cache dir, never in it. In it, the
image layers' files (the images' user's) made every later `make serve` on the machine refuse to start: the service
checks that nothing beneath its cache dir is another user's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from service.cache.permissions import cache_dir_problem

ENV_SH = Path(__file__).resolve().parents[3] / "scripts" / "container" / "env.sh"
pytestmark = pytest.mark.skipif(not ENV_SH.is_file(), reason="scripts/ is not in this build context (the test image)")


def _sourced(home: Path) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    out = subprocess.run(
        ["bash", "-c", f'source "{ENV_SH}" && echo "$CONTAINER_HOME"'],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return {"CONTAINER_HOME": out.stdout.strip()}


def test_the_storage_is_not_beneath_the_services_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    from service.settings import default_cache_dir

    storage = Path(_sourced(tmp_path)["CONTAINER_HOME"])
    assert storage.is_dir()
    assert default_cache_dir() not in (storage, *storage.parents)


def test_a_storage_left_in_the_cache_dir_moves_out_and_the_service_starts_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    from service.settings import default_cache_dir

    old = default_cache_dir() / "containers"
    layer = old / "storage" / "overlay" / "abc" / "diff" / "home" / "app"
    layer.mkdir(parents=True)
    (old / "storage" / "libpod").mkdir()
    (old / "storage" / "libpod" / "bolt_state.db").write_bytes(b"names the old path")
    if os.geteuid() == 0:  # as an image's layer holds its user's files
        os.chown(layer, 1000, 1000)
        assert "belongs to uid 1000" in cache_dir_problem(default_cache_dir())
    storage = Path(_sourced(tmp_path)["CONTAINER_HOME"])
    assert not old.exists() and (storage / "storage" / "overlay" / "abc" / "diff" / "home" / "app").is_dir()
    assert not (storage / "storage" / "libpod" / "bolt_state.db").exists()  # podman would list no image with it
    assert cache_dir_problem(default_cache_dir()) is None
