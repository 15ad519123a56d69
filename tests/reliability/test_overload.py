"""Overload: a bounded admission queue (vLLM's --max-num-queued-reqs via max_queued_requests). Past it,
503 + Retry-After at once; never a hang, never a crash; every admitted request completes in full."""

from __future__ import annotations

import asyncio
import collections
import json
import statistics
import threading
import time

import httpx
import pytest

from tests.reliability.conftest import MAX_QUEUED, SERVED

pytestmark = pytest.mark.engine

MIB = 1 << 20
CAPACITY = MAX_QUEUED  # requests admitted at once (running + waiting)
LOAD_CLIENTS = 4 * CAPACITY
LOAD_SECONDS = 60
LOAD_TOKENS = 32
RETRY_PAUSE_S = 0.05  # clients retry at once instead of honouring Retry-After: keeps the pressure at 4x


def check_503(resp: httpx.Response) -> None:
    assert resp.status_code == 503
    assert int(resp.headers["retry-after"]) > 0
    error = resp.json()["error"]
    assert error["code"] == 503 and error["message"]


async def one_request(client: httpx.AsyncClient, server, stream: bool, max_tokens: int) -> tuple[int, bool, float]:
    """(status, complete, seconds). complete: the full answer arrived (max_tokens tokens, finish 'length')."""
    start = time.monotonic()
    if not stream:
        resp = await client.post(
            "/v1/completions",
            json={"model": SERVED, "prompt": "hello world", "max_tokens": max_tokens, "ignore_eos": True},
        )
        if resp.status_code == 503:
            check_503(resp)
        complete = (
            resp.status_code == 200
            and resp.json()["usage"]["completion_tokens"] == max_tokens
            and resp.json()["choices"][0]["finish_reason"] == "length"
        )
        return resp.status_code, complete, time.monotonic() - start
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            if resp.status_code == 503:
                check_503(resp)
            return resp.status_code, False, time.monotonic() - start
        usage, done, finish = None, False, None
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    finish = choice.get("finish_reason") or finish
        complete = done and finish == "length" and (usage or {}).get("completion_tokens") == max_tokens
        return 200, complete, time.monotonic() - start


def client_for(server, concurrency: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url,
        headers=server.headers(),
        timeout=httpx.Timeout(60.0),
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
    )


def test_burst_beyond_the_queue_gets_503_with_retry_after_at_once(server):
    server.wait_idle(30)
    burst = 4 * CAPACITY

    async def run():
        async with client_for(server, burst) as client:
            return await asyncio.gather(*(one_request(client, server, False, 128) for _ in range(burst)))

    results = asyncio.run(run())
    statuses = collections.Counter(status for status, _, _ in results)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[503] >= burst - 2 * CAPACITY, statuses  # most of the burst is turned away ...
    assert statuses[200] >= CAPACITY, statuses  # ... and what was admitted is served
    assert all(complete for status, complete, _ in results if status == 200)
    # "At once" means without waiting for a free slot: a 503 held until capacity frees would take at least as
    # long as an admitted answer. Relative, not a fixed number of seconds: on a loaded 2-core machine the engine's
    # decoding also slows the API process that sends the 503s.
    rejected = statistics.median(took for status, _, took in results if status == 503)
    served = statistics.median(took for status, _, took in results if status == 200)
    assert rejected < served / 2, f"503s were not at once: median {rejected:.2f}s vs {served:.2f}s for a served answer"
    server.wait_idle(10)


def test_four_times_capacity_for_a_minute(server):
    """LOAD_CLIENTS closed-loop clients (4x the admitted capacity) for LOAD_SECONDS, half streaming chat,
    half plain completions. Only 200/503; every 200 complete; no transport error; memory bounded."""
    server.wait_idle(30)
    rss_samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample_memory():
        t0 = time.monotonic()
        while not stop.is_set():
            rss_samples.append((time.monotonic() - t0, server.rss_bytes()))
            stop.wait(2.0)

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    statuses: collections.Counter = collections.Counter()
    incomplete: list[str] = []
    failures: list[str] = []
    latencies: list[float] = []

    async def worker(client, index, deadline):
        i = 0
        while time.monotonic() < deadline:
            stream = (index + i) % 2 == 0
            i += 1
            try:
                status, complete, took = await one_request(client, server, stream, LOAD_TOKENS)
            except (httpx.HTTPError, AssertionError, ValueError, KeyError) as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            statuses[status] += 1
            if status == 200:
                latencies.append(took)
                if not complete:
                    incomplete.append(f"client {index} request {i} (stream={stream})")
            else:
                await asyncio.sleep(RETRY_PAUSE_S)

    async def run():
        deadline = time.monotonic() + LOAD_SECONDS
        async with client_for(server, LOAD_CLIENTS) as client:
            await asyncio.gather(*(worker(client, n, deadline) for n in range(LOAD_CLIENTS)))

    started = time.monotonic()
    try:
        asyncio.run(run())
    finally:
        stop.set()
        sampler.join(10)
    elapsed = time.monotonic() - started

    rss = [r for _, r in rss_samples]
    late = [r for t, r in rss_samples if t >= 15] or rss
    print(
        f"load: {LOAD_CLIENTS} clients (4x capacity {CAPACITY}) for {elapsed:.0f}s: {dict(statuses)}; "
        f"{statuses[200] / elapsed:.1f} completed req/s, {statuses[200] * LOAD_TOKENS / elapsed:.0f} tok/s, "
        f"latency p50 {statistics.median(latencies):.2f}s max {max(latencies):.2f}s; "
        f"RSS {min(rss) / MIB:.0f}-{max(rss) / MIB:.0f} MiB (after 15 s: {min(late) / MIB:.0f}-{max(late) / MIB:.0f})"
    )
    assert not failures, failures[:5]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[200] > 0 and statuses[503] > 0, statuses  # served and shed: it really was overloaded
    assert not incomplete, incomplete[:5]
    assert max(latencies) < 30, "an admitted request waited far too long: the queue is not bounded"
    assert max(late) - min(late) < 128 * MIB, "memory kept growing under steady load"
    # Afterwards: idle, ready, serving.
    server.wait_idle(10)
    assert httpx.get(f"{server.url}/ready").status_code == 200
    status, complete, _ = asyncio.run(_single(server))
    assert status == 200 and complete


async def _single(server):
    async with client_for(server, 1) as client:
        return await one_request(client, server, True, LOAD_TOKENS)
