"""The server harness (harness/) shared by the tests and the bench, on a real process: Python's own HTTP server."""

from __future__ import annotations

import os
import signal
import sys

import httpx
import pytest

from harness import ServerProcess, offline_env


def test_start_wait_ready_stop(tmp_path):
    (tmp_path / "ready").write_text("ok")
    server = ServerProcess(
        offline_env(),
        tmp_path / "http.log",
        [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        "/ready",
        "http",
    )
    server.start()
    try:
        took = server.wait_ready(timeout=30, interval=0.05)
        assert took == server.started_s and took > 0
        assert server.ready_statuses[-1] == (200, "ok")  # not JSON: kept as text
        assert httpx.get(server.url + "/ready").text == "ok"
        # The server's CPU clock, not ours: it agrees with the kernel's tick count for that pid, and it moves with
        # the requests the server serves.
        cpu = server.api_cpu_s()
        stat = open(f"/proc/{server.pid}/stat").read().rsplit(")", 1)[1].split()
        assert abs(cpu - (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")) < 0.05
        for _ in range(20):
            httpx.get(server.url + "/ready")
        assert server.api_cpu_s() > cpu
        assert os.getpgid(server.pid) == server.pid  # its own process group, for kill_group
        assert os.getsid(server.pid) == os.getsid(0)  # the caller's session: one scheduling group with its clients
    finally:
        code = server.stop(timeout=10)
        server.kill_group()
    assert code == -signal.SIGTERM


def test_a_server_that_exits_is_reported_with_its_log(tmp_path):
    server = ServerProcess(
        {}, tmp_path / "x.log", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], name="x"
    )
    server.start()
    with pytest.raises(RuntimeError, match="x exited with 3:\nboom"):
        server.wait_ready(timeout=30, interval=0.05)
    server.close()


def test_offline_env_drops_the_named_prefixes():
    env = offline_env({"SERVICE_PORT": "1", "OMP_NUM_THREADS": "2", "PATH": "/bin"}, drop=("SERVICE_", "OMP_"))
    assert env["PATH"] == "/bin" and "SERVICE_PORT" not in env and "OMP_NUM_THREADS" not in env
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_TARGET_DEVICE"] == "cpu"
