"""bench/servers.py: the service's report as the bench reads it, and vLLM's server started from it."""

from __future__ import annotations

import json
import sys

from bench.servers import MAX_QUEUED, Reported, vllm_argv, vllm_defaults, vllm_same_engine
from tests.unit.bench.bench_results import HARDWARE


def test_reported_engine_arguments_environment_and_cpus():
    r = Reported(HARDWARE)
    assert r.engine_args == {"tensor_parallel_size": 1, "enable_prefix_caching": False}
    assert r.env == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert r.engine_cpus == [0, 1] and r.reserved_cpus == [2] and r.allowed_cpus == [0, 1, 2, 3]
    assert r.machine()["family_model"] == "6/207" and r.machine()["memory_gib"] == 8.0


def test_vllm_gets_the_reported_engine_arguments_and_environment(tmp_path):
    r = Reported(HARDWARE)
    server = vllm_same_engine("/m", "demo", r, tmp_path / "log")
    argv = server.argv
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "{port}"
    assert "--tensor-parallel-size" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert "--no-enable-prefix-caching" in argv
    assert argv[-2:] == ["--max-num-queued-reqs", str(MAX_QUEUED)]
    assert server.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and server.ready_path == "/v1/models"
    assert not any(k.startswith("SERVICE_") for k in server.env)
    defaults = vllm_defaults("/m", "demo", 1 << 30, tmp_path / "log2").argv
    assert defaults[-2:] == ["--kv-cache-memory-bytes", str(1 << 30)]
    assert vllm_argv("/m", "demo", {}, None)[-2:] == ["--port", "{port}"]


def test_reported_reads_the_json_the_service_serves():
    # The field names the bench relies on are those of StartupReport.to_dict(); a round trip through JSON keeps them.
    assert Reported(json.loads(json.dumps(HARDWARE))).engine_args == Reported(HARDWARE).engine_args
