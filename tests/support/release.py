"""Test servers stopped in the background: a vLLM engine takes ~4 s to shut down (engine core, workers), and a
session starts and stops ~40 of them. `release(process)` sends SIGTERM at once and leaves the wait (and the kill,
should the group linger) to a thread, so the test goes on meanwhile (a quality check computes its reference) and the
session's last teardown stops every shared server at once. `reap()` waits for them: before each test and each server
start, since a server (and `detect`) plans its KV cache from the memory free at start, which a server still shutting
down holds. Tests that check how a server stops call its `stop()` instead."""

from __future__ import annotations

import threading
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


_STOPPING: list[threading.Thread] = []


def release(process: Closable) -> None:
    thread = threading.Thread(target=process.close, name="release-server", daemon=True)
    thread.start()
    _STOPPING.append(thread)


def reap(timeout: float = 120) -> None:
    while True:
        try:  # a server may start in another thread (tests/integration/test_real_model_quality.py), reaping too
            thread = _STOPPING.pop()
        except IndexError:
            return
        thread.join(timeout)
