"""While a model downloads on the first start, before the service's app exists, the port answers: `/health` 200
(the process is alive: an orchestrator must not restart a download), `/ready` 503 with the download's progress
("downloading org/name: 41% (...)"), every other route 503 with Retry-After in the OpenAI error shape. A plain
http.server on the service's address, in a thread; closed when the download ends, before the service binds it."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RETRY_AFTER_SECONDS = "10"


@contextmanager
def download_status(sock: socket.socket, first: str) -> Iterator[Callable[[str], None]]:
    """Serve the status on `sock` (bound, not listening) until the block ends; yields the setter of the progress."""
    state = {"line": first}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # the download's own log lines say enough
            pass

        def _answer(self, status: int, body: dict[str, object], retry: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if retry:
                self.send_header("Retry-After", RETRY_AFTER_SECONDS)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _route(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._answer(200, {"status": "starting", "reason": state["line"]})
            elif path == "/ready":
                self._answer(503, {"status": "not ready", "reason": state["line"]})
            else:
                message = f"the service is starting: {state['line']}; retry later"
                error = {"message": message, "type": "service_unavailable", "param": None, "code": 503}
                self._answer(503, {"error": error}, retry=True)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _route  # noqa: N815

    server = ThreadingHTTPServer(sock.getsockname()[:2], Handler, bind_and_activate=False)
    server.socket.close()  # the one it made: it serves the service's own
    server.socket = sock
    server.server_activate()
    thread = threading.Thread(target=server.serve_forever, name="download-status", daemon=True)
    thread.start()
    try:
        yield lambda line: state.__setitem__("line", line)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
