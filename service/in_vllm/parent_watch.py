"""A vLLM process the service started ends when the process that started it is gone.

vLLM 0.32's engine core outlives an API server killed with SIGKILL (the OOM killer, a supervisor's forced stop,
vllm#55510): it and its worker keep the KV cache's memory and the cores, reparented, and the restarted service is
refused "the model does not fit". A thread of each vLLM process (spawned or forked) looks at its parent once a second; once it
is gone, the process sends itself SIGTERM, which vLLM's engine core answers with its own shutdown (its workers
follow through vLLM's death pipe), and SIGKILL if that has not ended it. Not prctl(PR_SET_PDEATHSIG): that fires
when the spawning *thread* ends, and the API server starts the engine from an executor thread.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

INTERVAL_S = 1.0
SHUTDOWN_S = 30.0  # for vLLM's own shutdown after the SIGTERM


def watch_parent() -> int | None:
    """Starts the watch in a process multiprocessing started (vLLM's engine core and workers); the parent's pid,
    or None in a process that was not spawned so (the API server)."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return None
    threading.Thread(target=_watch, args=(parent.pid,), name="service-parent-watch", daemon=True).start()
    return parent.pid


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:  # reparented once the parent is gone (already, if it died before this)
        time.sleep(INTERVAL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(SHUTDOWN_S)
    os.kill(os.getpid(), signal.SIGKILL)
