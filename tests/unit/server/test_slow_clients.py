"""Silent and slow clients against the service's connection layer (request_head_timeout.py, request_cap.py), on a real
uvicorn server in a thread, with a small app: the probes answer whatever the number of open sockets, a request head
that trickles in is cut off, API requests past the cap get 503 while the probes keep their reservation. The same
against the real service: tests/reliability/test_slow_clients.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from service.server.http.request_cap import RequestCapMiddleware
from service.server.http.request_head_timeout import head_timeout_protocol
from tests.support.server import free_port

HEAD_TIMEOUT_S = 0.5
API_LIMIT = 4


@pytest.fixture
def server():
    app = FastAPI()
    release = threading.Event()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/v1/slow")
    async def slow() -> dict[str, str]:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return {"done": "yes"}

    app.add_middleware(RequestCapMiddleware, limit=API_LIMIT, reserved_paths=frozenset({"/health"}), reserved_limit=8)
    closed: list[int] = []
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_keep_alive=30,
        http=head_timeout_protocol(HEAD_TIMEOUT_S, lambda: closed.append(1)),
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield {"url": f"http://127.0.0.1:{port}", "port": port, "closed": closed, "release": release}
    release.set()
    srv.should_exit = True
    thread.join(10)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _closed_by_peer(sock: socket.socket, within_s: float) -> float | None:
    """Seconds until the server closed `sock` (it reads EOF or a reset), None if still open after `within_s`."""
    start = time.monotonic()
    sock.settimeout(within_s)
    try:
        data = sock.recv(1024)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return time.monotonic() - start
    return time.monotonic() - start if data == b"" else None


def test_silent_sockets_do_not_starve_the_probes_and_are_closed(server):
    silent = [_connect(server["port"]) for _ in range(200)]  # more than the old connection cap of that app
    try:
        started = time.monotonic()
        assert httpx.get(f"{server['url']}/health", timeout=5).status_code == 200
        assert time.monotonic() - started < 5
        # An API request too: the cap counts requests, not sockets.
        server["release"].set()
        assert httpx.get(f"{server['url']}/v1/slow", timeout=5).status_code == 200
        assert all(_closed_by_peer(sock, HEAD_TIMEOUT_S + 5) is not None for sock in silent[:5])
    finally:
        for sock in silent:
            sock.close()
    assert len(server["closed"]) >= 5


def test_a_head_sent_one_byte_at_a_time_is_cut_off(server):
    sock = _connect(server["port"])
    head = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100
    started = time.monotonic()
    try:
        for byte in head:
            sock.sendall(bytes([byte]))
            if _closed_by_peer(sock, 0.1) is not None:
                break
        else:
            pytest.fail("the server read a 100-byte trickle to its end without closing the connection")
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    assert HEAD_TIMEOUT_S * 0.9 <= time.monotonic() - started < HEAD_TIMEOUT_S + 3


def test_an_idle_kept_alive_connection_is_not_cut_by_the_head_timer(server):
    with httpx.Client(base_url=server["url"], timeout=5) as client:
        assert client.get("/health").status_code == 200
        time.sleep(HEAD_TIMEOUT_S * 3)
        second = client.get("/health")
        assert second.status_code == 200
        assert client.get("/health").extensions["network_stream"] is second.extensions["network_stream"]


def test_api_requests_past_the_cap_get_503_and_the_probes_keep_their_reservation(server):
    async def flood() -> tuple[list[int], int]:
        async with httpx.AsyncClient(base_url=server["url"], timeout=20) as client:
            slow = [asyncio.create_task(client.get("/v1/slow")) for _ in range(API_LIMIT)]
            await asyncio.sleep(0.5)  # the cap's worth of API requests in flight
            refused = await client.get("/v1/slow")
            probe = await client.get("/health")
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
            assert refused.json()["error"]["code"] == 503
            server["release"].set()
            return [r.status_code for r in await asyncio.gather(*slow)], probe.status_code

    statuses, probe = asyncio.run(flood())
    assert statuses == [200] * API_LIMIT
    assert probe == 200
