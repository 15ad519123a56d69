"""The tokens one engine step takes (max_num_batched_tokens), read back from the running engine: vLLM's scheduler
logs the value it runs with, and a prompt several steps long is prefilled in chunks and answered."""

from __future__ import annotations

import random

import httpx
import pytest

from tests.reliability.conftest import MAX_NUM_BATCHED_TOKENS, SERVED


@pytest.mark.engine
def test_a_long_prompt_is_prefilled_in_steps_of_the_chunk_the_plan_chose(server):
    report = httpx.get(f"{server.url}/v1/hardware", headers=server.headers(), timeout=10).json()
    [chunk] = [d for d in report["decisions"] if d["setting"] == "engine.max_num_batched_tokens"]
    assert (chunk["value"], chunk["source"]) == (MAX_NUM_BATCHED_TOKENS, "user")
    # vLLM's SchedulerConfig, as the engine took it
    assert f"Chunked prefill is enabled with max_num_batched_tokens={MAX_NUM_BATCHED_TOKENS}." in (
        server.process.log_tail(10**7)
    )

    length = 5 * MAX_NUM_BATCHED_TOKENS + 7
    # fresh token ids: no prefix-cache hit shortens the prefill
    prompt = [random.randrange(10, 200) for _ in range(length)]
    reply = httpx.post(
        f"{server.url}/v1/completions",
        headers=server.headers(),
        json={"model": SERVED, "prompt": prompt, "max_tokens": 2},
        timeout=120,
    )
    assert reply.status_code == 200
    usage = reply.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (length, 2)
