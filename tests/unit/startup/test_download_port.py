"""service/startup/download_port.py: what an orchestrator, a client and anyone else on the network see while a
first start downloads its model, before the service's app (and its key) exist."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from service.startup.download_port import REQUEST_TIMEOUT_S, download_status


@pytest.fixture
def status():
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    with download_status(sock) as progress:
        yield f"http://127.0.0.1:{port}", port, progress


def test_the_probes_answer_with_the_progress_but_not_the_model(status):
    url, _, progress = status
    assert httpx.get(url + "/ready").status_code == 503
    progress("downloading acme/secret-model: 41% (3.0 of 7.4 MB, 1.0 MB/s)")
    ready, health = httpx.get(url + "/ready"), httpx.get(url + "/health")
    assert ready.status_code == 503 and "41% (3.0 of 7.4 MB, 1.0 MB/s)" in ready.json()["reason"]
    assert health.status_code == 200 and "41%" in health.json()["reason"]
    chat = httpx.post(url + "/v1/chat/completions", json={})
    assert chat.status_code == 503 and chat.headers["retry-after"] and chat.json()["error"]["code"] == 503
    for answer in (ready, health, chat):
        assert "acme" not in answer.text and "secret-model" not in answer.text


def test_silent_clients_cannot_hold_the_probes_back_and_are_cut_off(status):
    url, port, _ = status
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
    trickle = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        started = time.monotonic()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        assert time.monotonic() - started < 2
        for byte in b"GET /health HTTP/1.1\r\nX-Slow: abc":  # slowloris: a byte every 0.25 s, past the deadline
            try:
                trickle.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.25)
        for sock in (silent[0], trickle):
            sock.settimeout(REQUEST_TIMEOUT_S + 3)
            try:
                assert sock.recv(1024) == b""  # closed by the server, without an answer
            except ConnectionResetError:
                pass
        assert time.monotonic() - started < REQUEST_TIMEOUT_S + 5
    finally:
        for sock in (*silent, trickle):
            sock.close()


def test_the_port_is_closed_once_the_download_ends():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with download_status(sock):
        assert httpx.get(url + "/health").status_code == 200
    with pytest.raises(httpx.ConnectError):  # the service binds it next
        httpx.get(url + "/health", timeout=2)


def test_a_port_it_cannot_serve_is_an_error_not_a_hang():
    sock = socket.socket()
    sock.close()  # closed: listen() fails
    with pytest.raises(OSError), download_status(sock):
        pass
