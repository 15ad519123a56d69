"""A port already in use refuses the start at once: exit 2 naming the address, before any engine process (uvicorn
binds only when it starts serving: the engine had loaded for a minute and the process exited 3)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from service.server.supervision.lifecycle import EXIT_STARTUP_REFUSED
from tests.support.server import MODELS, service_env


def test_a_port_in_use_refuses_the_start_before_the_engine_loads():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "service", "serve"],
            # A small KV cache: the memory check passes beside the test session's other servers.
            env=service_env(MODELS, host="127.0.0.1", port=str(port), kv_cache_gib="0.1", memory_headroom_gib="0.1"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        took = time.monotonic() - started
    log = out.stdout + out.stderr
    assert out.returncode == EXIT_STARTUP_REFUSED, log[-3000:]
    assert f"refusing to start: cannot listen on 127.0.0.1:{port}: Address already in use" in log, log[-3000:]
    assert "Initializing a V1 LLM engine" not in log and "EngineCore" not in log
    print(f"port in use: refused after {took:.1f}s")
