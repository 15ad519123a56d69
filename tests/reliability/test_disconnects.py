"""Clients that hang up mid-stream: the engine aborts each request, memory stays flat, service goes on."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.reliability.conftest import MAX_NUM_SEQS, MAX_QUEUED, SERVED, start_server
from tests.support.decode_rate import stream_timing
from tests.support.release import release

pytestmark = pytest.mark.engine

# Room for answers that take seconds even on a fast CPU; beyond the demo model's 2048 positions (hence
# VLLM_ALLOW_LONG_MAX_MODEL_LEN), and a server of its own: the shared one keeps a short context so fuzzed
# requests stay short.
MAX_MODEL_LEN = 8192
CUTOFFS = 50
CHUNKS_BEFORE_HANGUP = 3
# A full answer takes this long at the rate measured on the machine at hand, so a fast CPU cannot finish it in
# the moment between the client's third chunk and its hang-up (a fixed length did on a Zen 5).
ANSWER_SECONDS = 6
MIB = 1 << 20


@pytest.fixture(scope="module")
def long_server(reliability_logs, api_key):
    srv = start_server(
        "disconnects",
        reliability_logs / "disconnects.log",
        api_key=api_key,
        max_num_seqs=str(MAX_NUM_SEQS),
        max_queued_requests=str(MAX_QUEUED),
        max_model_len=str(MAX_MODEL_LEN),
        extra_env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    )
    yield srv
    release(srv.process)


def answer_tokens(server) -> int:
    """Tokens a full answer gets: ANSWER_SECONDS of decoding as one of MAX_NUM_SEQS concurrent streams."""
    timing = stream_timing(server.url, SERVED, MAX_NUM_SEQS, MAX_MODEL_LEN, server.headers())
    return timing.tokens_for(ANSWER_SECONDS, MAX_MODEL_LEN - 16)


def stream_and_hang_up(server, max_tokens: int) -> int:
    """Open a streaming completion, read a few tokens, close the connection. Returns chunks read."""
    body = {"model": SERVED, "prompt": "hello world", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    read = 0
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{server.url}/v1/completions", json=body, headers=server.headers()) as resp:
            assert resp.status_code == 200, resp.read()[:300]
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    read += 1
                    if read >= CHUNKS_BEFORE_HANGUP:
                        break
    return read  # leaving both blocks closes the socket with the response unfinished


def full_stream(server, max_tokens: int = 24) -> tuple[int, bool]:
    body = {
        "model": SERVED,
        "prompt": "hello world",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage, done = None, False
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=server.headers(), timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
    return (usage or {}).get("completion_tokens", -1), done


def test_streams_cut_off_mid_way_are_aborted_and_leave_nothing_behind(long_server):
    server = long_server
    server.wait_idle(30)
    max_tokens = answer_tokens(server)
    for _ in range(4):  # warm the paths (allocator, tokenizer caches) before the memory baseline
        stream_and_hang_up(server, max_tokens)
    server.wait_idle(10)
    rss_before = server.rss_bytes()
    # vLLM counts requests that finish (stop/length) in request_success_total, aborted ones nowhere: a
    # cut-off request that ran to its end would show up there.
    finished_before = server.metric_by_label("vllm:request_success_total", "finished_reason")
    tokens_before = server.metrics().get("vllm:generation_tokens_total", 0)

    idle_after: list[float] = []
    with ThreadPoolExecutor(MAX_NUM_SEQS) as pool:
        for _ in range(CUTOFFS // MAX_NUM_SEQS):
            reads = list(pool.map(lambda _: stream_and_hang_up(server, max_tokens), range(MAX_NUM_SEQS)))
            assert all(r == CHUNKS_BEFORE_HANGUP for r in reads), reads
            idle_after.append(server.wait_idle(2.0))  # raises when still running after 2 s

    finished_after = server.metric_by_label("vllm:request_success_total", "finished_reason")
    finished = sum(finished_after.get(r, 0) - finished_before.get(r, 0) for r in ("stop", "length"))
    generated = server.metrics().get("vllm:generation_tokens_total", 0) - tokens_before
    rss_after = server.rss_bytes()
    print(
        f"disconnects: {CUTOFFS} cut off after {CHUNKS_BEFORE_HANGUP} chunks of {max_tokens}; engine idle "
        f"after max {max(idle_after):.2f}s; ran to the end {finished:.0f}; tokens generated {generated:.0f} "
        f"(vs {CUTOFFS * max_tokens} if run to the end); RSS {rss_before / MIB:.0f} -> {rss_after / MIB:.0f} MiB"
    )
    # Without aborts every cut-off request would run to max_tokens (CUTOFFS * max_tokens tokens). A few may
    # legitimately finish first on a starved machine: the whole stream sits in the socket buffers before the
    # slow client has read its first chunks. Those are not clients that were gone.
    assert generated < CUTOFFS * max_tokens * 0.25, "the engine kept generating for clients that were gone"
    assert finished <= CUTOFFS // 10, f"{finished:.0f} cut-off requests were generated to the end"
    assert rss_after - rss_before < 64 * MIB

    # Later requests are served normally.
    for _ in range(3):
        tokens, done = full_stream(server)
        assert (tokens, done) == (24, True)
    resp = httpx.post(
        f"{server.url}/v1/completions",
        headers=server.headers(),
        timeout=60,
        json={"model": SERVED, "prompt": "hi", "max_tokens": 16, "ignore_eos": True},
    )
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 16
