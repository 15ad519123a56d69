"""Readiness, version, hardware report and the policy as the running engine really applied it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.facts.cpulist import parse_cpulist
from tests.support.live_cpu import expected_backend
from tests.support.server import REPO

pytestmark = pytest.mark.engine

LOG_STATS_INTERVAL_S = 10  # vLLM's VLLM_LOG_STATS_INTERVAL default


def test_ready_was_503_with_reason_before_the_engine_was_up(chat_server):
    statuses = [code for code, _ in chat_server.ready_statuses]
    assert statuses[-1] == 200 and 503 in statuses
    first_503 = next(body for code, body in chat_server.ready_statuses if code == 503)
    assert first_503["status"] == "starting" and first_503["reason"]


def test_serving_runs_under_vllms_own_server_lifespan(chat_server):
    """As under vLLM's own server: the start-up heap is frozen out of the garbage collector (without it a full
    collection walked it while serving, a 0.5 s pause of every stream), and the engine's stats are logged while
    it works."""
    log_path = chat_server.process.log_path
    frozen = re.search(r"froze (\d+) start-up objects", log_path.read_text(errors="replace"))
    assert frozen and int(frozen.group(1)) > 100_000, "torch, transformers and vLLM leave far more at start-up"

    body = {"model": chat_server.served_model, "prompt": "stats", "max_tokens": 48, "ignore_eos": True}
    deadline = time.monotonic() + 2 * LOG_STATS_INTERVAL_S
    while time.monotonic() < deadline:
        httpx.post(f"{chat_server.url}/v1/completions", json=body, headers=chat_server.headers(), timeout=60)
        if "Avg generation throughput" in log_path.read_text(errors="replace"):
            return
        time.sleep(1)
    pytest.fail(f"no engine stats line in {2 * LOG_STATS_INTERVAL_S} s of work")


def test_health_and_version(chat_server):
    assert httpx.get(f"{chat_server.url}/health").json()["status"] == "alive"
    version = httpx.get(f"{chat_server.url}/version").json()
    assert version["vllm"] == "0.32.0" and version["torch"].startswith("2.13") and version["service"]
    assert "zentorch" in version


def test_hardware_equals_detect_json_for_the_same_settings(chat_server):
    served = httpx.get(f"{chat_server.url}/v1/hardware", headers=chat_server.headers()).json()
    env = dict(chat_server.process.env)
    out = subprocess.run(
        [sys.executable, "-m", "service", "detect", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    detected = json.loads(out.stdout)
    # What was free at start is gone once the engine holds its KV cache: the served report keeps the start's
    # snapshot (the machine's and each NUMA node's) and the KV cache decided from it, a later detect sees less.
    # Everything else is the same.
    kv = "engine.kv_cache_memory_bytes"
    served_kv = next(d for d in served["decisions"] if d["setting"] == kv)
    assert served_kv["value"] == served["engine_args"]["kv_cache_memory_bytes"]
    assert served_kv["value"] <= served["hardware"]["memory_available_bytes"]
    assert "free at start" in served_kv["reason"]
    # vLLM's worker refuses a KV cache larger than what its NUMA node showed available: each rank's fits its node.
    hardware, nodes = served["hardware"], served["hardware"]["numa_node_memory"]
    for rank in served["threads"]["ranks"]:
        first = min(parse_cpulist(rank))
        node = next(n for n, cpus in hardware["numa_nodes"].items() if first in parse_cpulist(cpus))
        assert nodes[node]["available_bytes"] is not None and served_kv["value"] < nodes[node]["available_bytes"]
    # What the running engine adds: its prefix cache since start.
    assert set(served["prefix_cache"]) == {"queried_tokens", "hit_tokens", "hit_rate"}
    del served["prefix_cache"]
    assert _without_the_start_snapshot(served) == _without_the_start_snapshot(detected)
    assert chat_server.api_key not in json.dumps(served)


def _without_the_start_snapshot(report: dict) -> dict:
    report = json.loads(json.dumps(report))
    del report["hardware"]["memory_available_bytes"]
    del report["hardware"]["numa_node_memory"]  # a lazily initialized node's total grows as its pages are used
    del report["engine_args"]["kv_cache_memory_bytes"]
    report["decisions"] = [d for d in report["decisions"] if d["setting"] != "engine.kv_cache_memory_bytes"]
    return report


def test_hardware_needs_the_key(chat_server):
    assert httpx.get(f"{chat_server.url}/v1/hardware").status_code == 401


def _engine_pids(server) -> list[int]:
    children = subprocess.run(["pgrep", "-g", str(server.process.proc.pid)], capture_output=True, text=True).stdout
    return [int(p) for p in children.split() if int(p) != server.process.proc.pid]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_gdn_engine_runs_with_the_policy_settings(gdn_server):
    """Read back from the running engine (its metrics, its config log, its processes' environment)."""
    report = httpx.get(f"{gdn_server.url}/v1/hardware").json()
    decided = {d["setting"]: d["value"] for d in report["decisions"]}
    assert report["model"]["has_linear_attention"] is True

    metrics = httpx.get(f"{gdn_server.url}/metrics").text
    cache_info = re.search(r"^vllm:cache_config_info\{([^}]*)\}", metrics, re.M).group(1)
    assert f'enable_prefix_caching="{decided["engine.enable_prefix_caching"]}"' in cache_info
    assert f'kv_cache_memory_bytes="{decided["engine.kv_cache_memory_bytes"]}"' in cache_info

    log = gdn_server.process.log_tail(10**7)
    config_line = next(line for line in log.splitlines() if "Initializing a V1 LLM engine" in line)
    assert f"enable_prefix_caching={decided['engine.enable_prefix_caching']}" in config_line
    assert f"enable_chunked_prefill={decided['engine.enable_chunked_prefill']}" in config_line
    assert "Using CPU GDN prefill kernel" in log or "GDN" in log

    binding = next(line for line in log.splitlines() if "VLLM_CPU_OMP_THREADS_BIND=" in line)
    assert f"VLLM_CPU_OMP_THREADS_BIND='{decided['env.VLLM_CPU_OMP_THREADS_BIND']}'" in binding

    # Processes vLLM spawned show the environment they inherited (the engine core and workers rename
    # themselves with setproctitle, which blanks their /proc environ, so those are skipped).
    spawned = [
        pid for pid in _engine_pids(gdn_server) if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::")
    ]
    envs = [_environ(pid) for pid in spawned]
    assert envs, "vLLM spawned helper processes in the server's process group"
    for name, value in decided.items():
        if name.startswith("env."):
            assert all(e.get(name[4:]) == value for e in envs), name


def test_gdn_policy_on_amx_turns_caching_off(gdn_server):
    import torch

    report = httpx.get(f"{gdn_server.url}/v1/hardware").json()
    decided = {d["setting"]: d["value"] for d in report["decisions"]}
    on_amx = torch.cpu._is_amx_tile_supported()
    assert report["backend"]["name"] == expected_backend()
    assert decided["engine.enable_prefix_caching"] is (not on_amx)
    assert ("env.VLLM_SSM_CONV_STATE_LAYOUT" in decided) is on_amx


def test_gdn_generates(gdn_server):
    resp = httpx.post(
        f"{gdn_server.url}/v1/chat/completions",
        json={"model": "tiny-qwen3-next", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6},
        timeout=120,
    )
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 6
