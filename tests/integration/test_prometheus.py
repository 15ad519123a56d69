"""A real Prometheus server (Debian's package) scrapes the service; PromQL over its HTTP API sees traffic."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import httpx
import pytest

from tests.support.server import MODELS, free_port

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def prometheus(chat_server, tmp_path_factory):
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is installed by `make test-tools`"
    work = tmp_path_factory.mktemp("prometheus")
    target = chat_server.url.removeprefix("http://")
    (work / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        f"scrape_configs:\n  - job_name: service\n    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=open(work / "prometheus.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(60):
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def query(prom: str, promql: str) -> float | None:
    result = httpx.get(f"{prom}/api/v1/query", params={"query": promql}).json()["data"]["result"]
    return sum(float(r["value"][1]) for r in result) if result else None


def wait_for(prom: str, promql: str, predicate, timeout: float = 30) -> float | None:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = query(prom, promql)
        if value is not None and predicate(value):
            return value
        time.sleep(0.5)
    return value


def test_prometheus_sees_tokens_and_requests_increase(prometheus, chat_server):
    assert wait_for(prometheus, 'up{job="service"}', lambda v: v == 1) == 1
    tokens_q = 'vllm:generation_tokens_total{job="service"}'
    http_q = 'http_requests_total{job="service",handler="/v1/chat/completions",status="2xx"}'
    before_tokens = wait_for(prometheus, tokens_q, lambda v: True) or 0.0
    before_http = query(prometheus, http_q) or 0.0
    resp = httpx.post(
        f"{chat_server.url}/v1/chat/completions",
        headers=chat_server.headers(),
        json={"model": chat_server.served_model, "messages": [{"role": "user", "content": "count"}], "max_tokens": 9},
        timeout=120,
    )
    assert resp.status_code == 200
    assert wait_for(prometheus, tokens_q, lambda v: v >= before_tokens + 9) >= before_tokens + 9
    assert wait_for(prometheus, http_q, lambda v: v >= before_http + 1) >= before_http + 1
    assert query(prometheus, 'service_info{job="service"}') == 1


def test_promtool_accepts_the_exposition(chat_server):
    text = httpx.get(f"{chat_server.url}/metrics").text
    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    problems = [line for line in (checked.stdout + checked.stderr).splitlines() if line.strip()]
    # Exit 1 is a parse error; 3 is lint. vLLM names its own metrics `vllm:*` (a colon, some histograms
    # ending in _total) and dashboards rely on those names; every other metric, ours included, must be clean.
    assert checked.returncode in (0, 3), problems
    others = [p for p in problems if not p.startswith("vllm:")]
    assert others == []


def test_metrics_have_no_unbounded_labels(chat_server):
    text = httpx.get(f"{chat_server.url}/metrics").text
    assert "chatcmpl-" not in text and "cmpl-" not in text
    assert chat_server.api_key not in text
    assert "service_info{" in text and "service_startup_seconds" in text
    assert "service_decision_info{" in text
    # /metrics is open: no label names a path of the machine (the demo model's directory in the cache was one).
    # (Routes are the handler label's values: paths of the API, not of the machine.)
    values = [(label, value) for label, value in re.findall(r'(\w+)="([^"]*)"', text) if label != "handler"]
    paths = [(label, value) for label, value in values if re.search(r"(^|[:=,\s])~?/\w", value)]
    assert paths == [] and str(MODELS) not in text, paths[:5]
