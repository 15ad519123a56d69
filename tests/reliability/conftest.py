"""Reliability suite: bad input, disconnects, overload, engine death, graceful shutdown, secrets.

One session-scoped server (small capacity: 2 running sequences, 6 admitted requests in all, 1024-token
context, 64 KiB bodies) serves the bad-input, disconnect, overload and security tests; engine death and
SIGTERM each get a short-lived server of their own. Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.release import release
from tests.support.server import MODELS, ServerProcess, start_service

MODEL_CACHE = MODELS
SERVED = "demo-tiny-llama"
MAX_NUM_SEQS = 2
MAX_QUEUED = 6  # vLLM's --max-num-queued-reqs: running + waiting requests admitted at once
MAX_MODEL_LEN = 1024  # long enough that a stream cut off early could not have finished anyway
MAX_NUM_BATCHED_TOKENS = 128  # a step's tokens: longer prompts are prefilled in chunks of this (test_prefill_chunk)
MAX_REQUEST_BYTES = 65536
LISTED_ORIGIN = "https://chat.example.com"  # the shared server's cors_origins
# Environment values that must never show up in answers or logs.
CANARIES = {
    "HF_TOKEN": "hf_canary" + secrets.token_hex(8),
    "RELIABILITY_CANARY_SECRET": "canary-" + secrets.token_hex(8),
}


@dataclass
class Server:
    process: ServerProcess
    api_key: str | None

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def pid(self) -> int:
        return self.process.proc.pid

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics summed over labels, e.g. {"vllm:num_requests_running": 0.0}."""
        text = httpx.get(f"{self.url}/metrics", headers=self.headers(), timeout=10).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
        return out

    def metric_by_label(self, name: str, label: str) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", headers=self.headers(), timeout=10).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    key = sample.labels.get(label, "")
                    out[key] = out.get(key, 0.0) + sample.value
        return out

    def rss_bytes(self) -> int:
        """Resident memory of the service process and everything it spawned (engine core, worker)."""
        root = psutil.Process(self.pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def wait_idle(self, timeout: float) -> float:
        """Seconds until vLLM reports no running and no waiting request; raises after `timeout`."""
        start = time.monotonic()
        while True:
            m = self.metrics()
            if m.get("vllm:num_requests_running", 0) == 0 and m.get("vllm:num_requests_waiting", 0) == 0:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(
                    f"engine still busy after {timeout}s: {m.get('vllm:num_requests_running')} "
                    f"running, {m.get('vllm:num_requests_waiting')} waiting"
                )
            time.sleep(0.1)

    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")


def start_server(
    name: str, log_path: Path, api_key: str | None = None, extra_env: dict[str, str] | None = None, **settings: str
) -> Server:
    """`name`: the engine's, as tests/support/engines.py registers it."""
    if api_key:
        settings["api_key"] = api_key
    return Server(start_service(log_path, extra_env=CANARIES | (extra_env or {}), name=name, **settings), api_key)


@pytest.fixture(scope="session")
def reliability_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reliability-logs")


@pytest.fixture(scope="session")
def api_key() -> str:
    return "rel-" + secrets.token_urlsafe(24)


@pytest.fixture(scope="session")
def server(reliability_logs, api_key):
    """The shared server: small capacity so overload is reachable, an API key, a small body limit."""
    srv = start_server(
        "reliability",
        reliability_logs / "shared.log",
        api_key=api_key,
        max_num_seqs=str(MAX_NUM_SEQS),
        max_queued_requests=str(MAX_QUEUED),
        max_model_len=str(MAX_MODEL_LEN),
        max_num_batched_tokens=str(MAX_NUM_BATCHED_TOKENS),
        max_request_bytes=str(MAX_REQUEST_BYTES),
        shutdown_grace_seconds="10",
        cors_origins=LISTED_ORIGIN,
    )
    yield srv
    release(srv.process)
