"""Test servers stopped in the background: a vLLM engine takes ~4 s to shut down (engine core, workers), and a
session starts and stops ~40 of them. `release(process)` sends SIGTERM at once and leaves the wait (and the kill,
should the group linger) to a thread, so the next test starts meanwhile; `reap()` waits for them all at the
session's end. Tests that check how a server stops call its `stop()` instead."""

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
    while _STOPPING:
        _STOPPING.pop().join(timeout)
