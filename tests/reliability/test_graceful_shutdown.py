"""SIGTERM: /ready 503 at once, new requests 503, in-flight requests (streaming too) finish in full, exit 0
within the configured grace period."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from service.server.lifecycle import Lifecycle, Phase
from service.server.run import DrainingServer
from tests.reliability.conftest import SERVED, start_server

pytestmark = pytest.mark.engine

GRACE_S = 25
# Near the demo model's 2048-token context: still running when SIGTERM arrives and while the probes get in.
LONG_TOKENS = 2000


def _stream(server, path: str, body: dict, first_event: asyncio.Event, result: dict) -> asyncio.Task:
    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            async with client.stream("POST", path, json=body) as resp:
                result["status"] = resp.status_code
                usage, done, finish = None, False, None
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        first_event.set()
                        chunk = json.loads(line[6:])
                        usage = chunk.get("usage") or usage
                        for choice in chunk.get("choices", []):
                            finish = choice.get("finish_reason") or finish
                    elif line == "data: [DONE]":
                        done = True
                result.update(tokens=(usage or {}).get("completion_tokens"), done=done, finish=finish,
                              ended=time.monotonic())

    return asyncio.create_task(run())


def test_sigterm_drains_in_flight_requests_and_exits_zero(reliability_logs):
    server = start_server(reliability_logs / "sigterm.log", shutdown_grace_seconds=str(GRACE_S), max_num_seqs="4")
    try:
        asyncio.run(_drain_scenario(server))
    finally:
        server.process.kill_group()


async def _drain_scenario(server):
    common = {"model": SERVED, "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True,
              "stream_options": {"include_usage": True}}
    results = [{}, {}, {}]
    started = [asyncio.Event() for _ in results]
    tasks = [
        _stream(server, "/v1/completions", {**common, "prompt": "hello"}, started[0], results[0]),
        _stream(server, "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "hi"}]},
                started[1], results[1]),
    ]

    async def plain():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            started[2].set()
            resp = await client.post("/v1/completions", json={"model": SERVED, "prompt": "hey",
                                                              "max_tokens": LONG_TOKENS, "ignore_eos": True})
            results[2].update(status=resp.status_code, tokens=resp.json().get("usage", {}).get("completion_tokens"),
                              done=True, finish=resp.json()["choices"][0]["finish_reason"], ended=time.monotonic())

    tasks.append(asyncio.create_task(plain()))
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
    await asyncio.sleep(0.3)
    assert not any("ended" in r for r in results), "requests finished before SIGTERM: make them longer"

    term_at = time.monotonic()
    server.process.proc.send_signal(signal.SIGTERM)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as probe:
        # The very first answer after the signal already says draining: no window of 200s. How soon it comes
        # is the event loop's latency while it streams 3 answers on a shared 2-core box: 30 ms idle, seconds
        # under load; it must come while the answers still run (asserted below).
        ready = await probe.get("/ready")
        ready_after = time.monotonic() - term_at
        assert ready.status_code == 503 and ready.json()["status"] == "draining", ready.text
        new = await probe.post("/v1/completions", json={"model": SERVED, "prompt": "late", "max_tokens": 4})
        assert new.status_code == 503 and int(new.headers["retry-after"]) > 0, new.text
        assert new.json()["error"]["code"] == 503
        assert (await probe.get("/health")).status_code == 200  # draining is alive, not dead
    assert not any("ended" in r for r in results), "in-flight requests had finished before the checks"

    await asyncio.wait_for(asyncio.gather(*tasks), GRACE_S + 10)
    code = await asyncio.to_thread(server.process.proc.wait, GRACE_S + 10)
    exited_after = time.monotonic() - term_at
    last_done = max(r["ended"] for r in results) - term_at
    print(f"sigterm: /ready 503 after {ready_after * 1000:.0f} ms; 3 in-flight requests ({LONG_TOKENS} tokens) "
          f"finished {last_done:.1f}s after SIGTERM; exit {code} after {exited_after:.1f}s (grace {GRACE_S}s)")
    for r in results:
        assert r["status"] == 200 and r["done"] and r["finish"] == "length" and r["tokens"] == LONG_TOKENS, r
    assert code == 0
    assert exited_after <= GRACE_S
    assert "received SIGTERM: draining" in server.log()


def test_the_drain_gives_up_after_the_grace_period():
    """A request that outlasts the grace period does not keep the process alive (no engine needed)."""
    import uvicorn

    async def scenario():
        lifecycle = Lifecycle()
        lifecycle.set_phase(Phase.READY, "ready")
        lifecycle.request_started()  # never finishes
        server = DrainingServer(uvicorn.Config(app=None), lifecycle, grace_s=0.5)
        t0 = time.monotonic()
        server.handle_exit(signal.SIGTERM, None)
        assert lifecycle.phase is Phase.DRAINING and not lifecycle.accepting
        await server._drain
        return time.monotonic() - t0, server.should_exit

    took, should_exit = asyncio.run(scenario())
    assert should_exit and 0.4 <= took < 2.0
