"""The warm-restart tests (native and in the default image) start the engine twice with torch.compile, the first
time compiling from scratch: minutes each on a small machine (`python -m bench --only-warm-start`). They run only when asked for:
`pytest -m compile_cache`. Servers the tests release stop in the background; each test, and the session's end, waits for them
(tests/support/release.py)."""

from __future__ import annotations

import pytest

from harness import SERVICE_ARGV, ServerProcess
from tests.support import engines
from tests.support.release import reap

MARKER = "compile_cache"
pytest_plugins = ["tests.support.phases"]


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARKER}: cold + warm engine start with torch.compile (slowest test)")
    _count_service_starts()


def _count_service_starts() -> None:
    """Every start of the service by a test counts against its engine's registration (tests/support/engines.py)."""
    start = ServerProcess.start
    if getattr(start, "counted", False):
        return

    def counted_start(self: ServerProcess) -> ServerProcess:
        if self.argv[-len(SERVICE_ARGV) :] == SERVICE_ARGV:  # also under a wrapper (unshare)
            engines.started(self.name)
        return start(self)

    counted_start.counted = True  # type: ignore[attr-defined]
    ServerProcess.start = counted_start  # type: ignore[method-assign]


def pytest_collection_modifyitems(config, items):
    if MARKER in (config.getoption("markexpr") or ""):
        return  # selected (or excluded) explicitly by -m
    kept = [item for item in items if item.get_closest_marker(MARKER) is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start their servers
def pytest_runtest_setup(item):
    reap()  # what a test plans from free memory must not see a server released before it


@pytest.fixture(scope="session", autouse=True)
def _reap_released_servers():
    """Set up first, torn down last: after every fixture has released its server (tests/support/release.py)."""
    yield
    reap()
