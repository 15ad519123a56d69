"""The service's Prometheus stat logger against vLLM's own: the same engine steps recorded by each give the same
`vllm:*` exposition after every step; and on the running service the counters and gauges follow real requests."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.support.server import MODELS, REPO, offline_env

# A fresh process per logger: vLLM's logger registers its metrics in prometheus_client's global registry.
PROBE = r"""
import json, sys
from pathlib import Path
from prometheus_client import REGISTRY, generate_latest
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats
from service.models.demo_model import ensure_demo_model
from service.server.supervision.stat_logger import prometheus_stat_logger

model = ensure_demo_model(Path(sys.argv[2]))
config = EngineArgs(model=str(model), served_model_name=["demo"]).create_engine_config()

def steps():
    # Two requests: a prefill step with prefix-cache hits and a waiting third; decode steps whose running, waiting
    # and KV-usage values repeat, change and come back; a preemption; a finished request; idle steps without
    # iteration stats.
    for i in range(40):
        prefill = i == 0
        sched = SchedulerStats(
            num_running_reqs=0 if i >= 36 else (1 if 20 <= i < 24 else 2),
            num_waiting_reqs=1 if i < 3 or i == 21 else 0,
            num_skipped_waiting_reqs=1 if i == 22 else 0,
            kv_cache_usage=0.0 if i >= 36 else 0.05 * (1 + i // 16),
            prefix_cache_stats=PrefixCacheStats(requests=2, queries=40, hits=16) if prefill else PrefixCacheStats(),
        )
        if i >= 36:
            yield sched, None
            continue
        it = IterationStats()
        it.num_generation_tokens = 1 if i in (20, 21, 22, 23) else 2
        if prefill:
            it.prompt_token_stats.computed, it.prompt_token_stats.local_cache_hit = 24, 16
            it.prompt_token_stats.cached_tokens, it.prompt_token_stats.total = 16, 40
            it.time_to_first_tokens_iter += [0.011, 0.012]
        else:
            it.inter_token_latencies_iter += [0.001 * (1 + i % 3)] * it.num_generation_tokens
        if i == 20:
            it.num_preempted_reqs = 1
        if i in (19, 35):
            it.finished_requests.append(FinishedRequestStats(
                finish_reason=FinishReason.LENGTH, e2e_latency=0.2, num_prompt_tokens=20, num_generation_tokens=20,
                max_tokens_param=20, queued_time=0.001, prefill_time=0.01, inference_time=0.19, decode_time=0.18,
                mean_time_per_output_token=0.009, num_cached_tokens=8,
            ))
        yield sched, it

def exposition():
    return [l for l in generate_latest(REGISTRY).decode().splitlines() if l.startswith("vllm:") and "_created" not in l]

logger = (prometheus_stat_logger() if sys.argv[1] == "service" else PrometheusStatLogger)(config, [0])
after_each = []
for sched, it in steps():
    logger.record(sched, it, None, 0)
    after_each.append(exposition())
print(json.dumps({"class": type(logger).__mro__[1].__name__, "after_each": after_each}))
"""


def _record(which: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, which, str(MODELS)],
        capture_output=True,
        text=True,
        env=offline_env(),
        cwd=REPO,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_same_exposition_as_vllms_logger_after_every_step():
    vllm, service = _record("vllm"), _record("service")
    assert service["class"] == "PrometheusStatLogger"  # a subclass of vLLM's, only its metric classes swapped
    assert len(service["after_each"]) == len(vllm["after_each"]) == 40
    for step, (ours, theirs) in enumerate(zip(service["after_each"], vllm["after_each"], strict=True)):
        assert ours == theirs, f"step {step}: " + "; ".join(sorted(set(ours) ^ set(theirs))[:6])
    final = "\n".join(service["after_each"][-1])
    assert 'vllm:generation_tokens_total{engine="0",model_name="demo"} 68.0' in final
    assert 'vllm:num_requests_running{engine="0",model_name="demo"} 0.0' in final


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.mark.engine
def test_live_counters_and_gauges_follow_requests(chat_server):
    """On the running service: tokens and requests counted exactly, the running gauge back at zero afterwards."""
    url, headers = chat_server.url, chat_server.headers()
    before = httpx.get(f"{url}/metrics").text
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    for n in (3, 11):
        resp = httpx.post(
            f"{url}/v1/completions",
            headers=headers,
            timeout=120,
            json={"model": chat_server.served_model, "prompt": "count to ten", "max_tokens": n, "ignore_eos": True},
        )
        assert resp.status_code == 200, resp.text
        for key in usage:
            usage[key] += resp.json()["usage"][key]
    after = httpx.get(f"{url}/metrics").text
    assert usage["completion_tokens"] == 14
    grew = {
        name: _metric(after, name) - _metric(before, name)
        for name in (
            "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total",
            "vllm:request_success_total",
        )
    }
    assert grew == {
        "vllm:generation_tokens_total": 14,
        "vllm:prompt_tokens_total": usage["prompt_tokens"],
        "vllm:request_success_total": 2,
    }
    assert _metric(after, "vllm:num_requests_running") == 0


def _histogram(text: str, name: str) -> tuple[float, float]:
    """(count, sum) of a histogram over its labels."""
    return _metric(text, name + "_count"), _metric(text, name + "_sum")


@pytest.mark.engine
def test_an_agent_sessions_cached_prompt_is_measured_per_request(chat_server):
    """A conversation re-sent with one more turn, as an agent does: the second request finds its prefix in the cache.
    Per request, the prompt, its cached tokens, the prefill and decode times are histograms; /v1/hardware gives the
    hit rate since start."""
    url, headers = chat_server.url, chat_server.headers()
    conversation = [{"role": "user", "content": " ".join(f"word{i}" for i in range(200))}]
    body = {"model": chat_server.served_model, "max_tokens": 4, "ignore_eos": True}
    before = httpx.get(f"{url}/metrics").text
    usages = []
    for turn in range(2):
        resp = httpx.post(
            f"{url}/v1/chat/completions", headers=headers, timeout=120, json=body | {"messages": conversation}
        )
        assert resp.status_code == 200, resp.text
        usages.append(resp.json()["usage"])
        conversation += [resp.json()["choices"][0]["message"], {"role": "user", "content": f"and turn {turn}"}]
    after = httpx.get(f"{url}/metrics").text
    count, cached = (
        a - b
        for a, b in zip(
            _histogram(after, "service_request_prompt_cached_tokens"),
            _histogram(before, "service_request_prompt_cached_tokens"),
            strict=True,
        )
    )
    assert count == 2
    assert 16 <= cached <= usages[0]["prompt_tokens"], (cached, usages)  # at least a block, at most the first prompt
    for name in ("vllm:request_prompt_tokens", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds"):
        assert _histogram(after, name)[0] - _histogram(before, name)[0] == 2, name
    hardware = httpx.get(f"{url}/v1/hardware", headers=headers, timeout=30).json()["prefix_cache"]
    assert hardware["hit_tokens"] >= cached and 0 < hardware["hit_rate"] <= 1, hardware
