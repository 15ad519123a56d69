"""Silent and slow clients against the real service: no key is needed to open sockets, so none of them may stop the
probes or the API. The shared server admits MAX_QUEUED requests; its old connection cap (uvicorn's
limit_concurrency, 8x that plus 64) answered every request 503 once that many sockets were open, sending nothing."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from service.server.http.request_cap import RESERVED_REQUESTS, request_limit
from service.server.http.request_head_timeout import HEAD_TIMEOUT_S
from tests.reliability.conftest import MAX_QUEUED, SERVED

pytestmark = pytest.mark.engine


def _port(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_the_caps_worth_of_silent_sockets_stops_neither_the_probes_nor_the_api(server):
    count = (request_limit(MAX_QUEUED) or 0) + RESERVED_REQUESTS + 16
    closed_before = server.metrics().get("service_slow_connections_closed_total", 0.0)
    silent = [socket.create_connection(("127.0.0.1", _port(server)), timeout=10) for _ in range(count)]
    try:
        started = time.monotonic()
        health = httpx.get(f"{server.url}/health", timeout=5)
        assert health.status_code == 200, health.text
        assert time.monotonic() - started < 5
        assert httpx.get(f"{server.url}/ready", timeout=5).status_code == 200
        body = {"model": SERVED, "prompt": "hi", "max_tokens": 2}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers(), timeout=60)
        assert reply.status_code == 200, reply.text
        # Then the service closes them: their heads never came.
        time.sleep(HEAD_TIMEOUT_S + 2)
        for sock in silent[:3]:
            sock.settimeout(5)
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for sock in silent:
            sock.close()
    closed = server.metrics()["service_slow_connections_closed_total"] - closed_before
    assert closed >= count


def test_a_slowloris_head_is_cut_off(server):
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=10)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"x" * 60
    started = time.monotonic()
    cut_after = None
    try:
        for byte in head:  # one byte a second
            sock.sendall(bytes([byte]))
            sock.settimeout(1.0)
            try:
                if sock.recv(1024) == b"":
                    cut_after = time.monotonic() - started
                    break
            except TimeoutError:
                continue
            except ConnectionResetError:
                cut_after = time.monotonic() - started
                break
    except (BrokenPipeError, ConnectionResetError):
        cut_after = time.monotonic() - started
    finally:
        sock.close()
    assert cut_after is not None, "the service read a 60-second trickle of one request head"
    assert cut_after < HEAD_TIMEOUT_S + 3
