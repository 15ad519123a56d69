"""While a model downloads on the first start, before the service's app exists, the port answers the probes:
`/health` 200 (the process is alive: an orchestrator must not restart a download), `/ready` 503 with the download's
progress ("downloading the model: 41% (...)"); every other route 503 with Retry-After in the OpenAI error shape. An
asyncio server on the service's address, in a thread of its own; closed when the download ends, before the service
binds it.

No key guards this port yet, so it says no more than the probes need: not which model is fetched (the log does).
Each connection gets one answer and a few seconds to send its request head, and costs a coroutine, not a thread: a
crowd of silent clients neither holds the probes back nor grows the process."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

RETRY_AFTER_SECONDS = "10"
REQUEST_TIMEOUT_S = 5.0  # the whole request head, as on the service's own port (request_head_timeout.py)
MAX_HEAD_BYTES = 8192
STARTING = "the service is starting: downloading the model"
_PERCENT = re.compile(r"\d+% .*")


def public_progress(line: str) -> str:
    """The progress anyone may read: how far, not what ("downloading org/name: 41% (...)" -> "...: 41% (...)")."""
    found = _PERCENT.search(line)
    return f"{STARTING}: {found[0]}" if found else STARTING


def _answer(path: str, line: str) -> bytes:
    if path == "/health":
        status, body, retry = "200 OK", {"status": "starting", "reason": line}, False
    elif path == "/ready":
        status, body, retry = "503 Service Unavailable", {"status": "not ready", "reason": line}, False
    else:
        error = {"message": f"{line}; retry later", "type": "service_unavailable", "param": None, "code": 503}
        status, body, retry = "503 Service Unavailable", {"error": error}, True
    data = json.dumps(body).encode()
    head = [
        f"HTTP/1.1 {status}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        "Connection: close",
        *([f"Retry-After: {RETRY_AFTER_SECONDS}"] if retry else []),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


@contextmanager
def download_status(sock: socket.socket) -> Iterator[Callable[[str], None]]:
    """Serve the status on `sock` (bound, not listening) until the block ends; yields the setter of the progress
    (the download's own lines, shown without the model's name)."""
    state = {"line": STARTING}
    loop = asyncio.new_event_loop()
    started = threading.Event()
    failed: list[OSError] = []
    stop: asyncio.Event | None = None

    async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            answer = _answer(path, state["line"])
            writer.write(answer.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n" if method == "HEAD" else answer)
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass  # silent, slow, oversized or gone: closed without an answer
        finally:
            writer.close()

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        try:
            server = await asyncio.start_server(serve_one, sock=sock, limit=MAX_HEAD_BYTES)
        except OSError as exc:  # said by the caller, whose download would otherwise go on without its port
            failed.append(exc)
            return
        finally:
            started.set()
        async with server:
            await stop.wait()
        clients = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in clients:  # connections still waiting for their head
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), name="download-status", daemon=True)
    thread.start()
    started.wait()
    if failed:
        thread.join()
        loop.close()
        raise failed[0]
    try:
        yield lambda line: state.__setitem__("line", public_progress(line))
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join()
        with suppress(RuntimeError):
            loop.close()
        sock.close()
