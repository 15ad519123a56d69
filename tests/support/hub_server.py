"""A loopback stand-in for the Hugging Face hub's file routes, for huggingface_hub run unchanged (HF_ENDPOINT): this
machine cannot reach the hub. It serves repos from a directory of real files, `<root>/<org>/<name>/<files>`:

- `GET /api/models/{repo}[/revision/{rev}]` (`?blobs=true`: sizes): the repo's commit and files;
- `GET /api/models/{repo}/tree/{rev}`: the file listing snapshot_download walks;
- `HEAD|GET /{repo}/resolve/{rev}/{file}`: the file, with the headers huggingface_hub reads (X-Repo-Commit, ETag,
  X-Linked-Etag / X-Linked-Size for the large files, as the hub marks LFS files) and byte ranges (resume).

`slow[file] = s` holds each GET of that file s seconds before its bytes; `stall_after[file] = n` sends the first GET of that file n bytes and then nothing, so that a test can kill the
download mid-way; `requests` logs each request as (method, path, Range header). A hostile endpoint's answers, for the
tests of what the service checks: `commit` (the commit every answer names), `etags[file]` (the ETag sent for a file),
`listed_as[file]` (the name a file is listed and served under), `ignore_range` (files sent whole whatever the Range).
Files are sent from disk a megabyte at a time, so that a test can measure what the client holds."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_FROM_BYTES = 10_000  # the hub stores larger files in LFS; their ETag is the sha256


@dataclass
class HubServer:
    root: Path
    stall_after: dict[str, int] = field(default_factory=dict)
    slow: dict[str, float] = field(default_factory=dict)  # file -> seconds its body waits before the bytes
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    commit: str = COMMIT
    etags: dict[str, str] = field(default_factory=dict)
    listed_as: dict[str, str] = field(default_factory=dict)
    ignore_range: set[str] = field(default_factory=set)

    def start(self) -> str:
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def files(self, repo: str) -> dict[str, Path]:
        base = self.root / repo
        names = {str(p.relative_to(base)): p for p in sorted(base.rglob("*")) if p.is_file()}
        return {self.listed_as.get(name, name): p for name, p in names.items()}

    def fetched(self, suffix: str) -> list[str]:
        """The files whose bytes were asked for (GET on a resolve route) ending in `suffix`."""
        return [
            path
            for method, path, _ in self.requests
            if method == "GET" and "/resolve/" in path and path.endswith(suffix)
        ]


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: the tests read `requests`
            pass

        def _json(self, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _missing(self, what: str) -> None:
            data = json.dumps({"error": f"{what} not found"}).encode()
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound" if "repo" in what else "EntryNotFound")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _entry(self, name: str, path: Path) -> dict[str, object]:
            size = path.stat().st_size
            entry: dict[str, object] = {
                "type": "file",
                "path": name,
                "size": size,
                "oid": hashlib.sha1(name.encode()).hexdigest(),
            }
            if size >= LFS_FROM_BYTES:
                entry["lfs"] = {"oid": _sha256(path), "size": size, "pointerSize": 134}
            return entry

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._serve(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._serve(body=False)

        def _serve(self, body: bool) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo = "/".join(parts[2:4])
                files = hub.files(repo)
                if not files:
                    return self._missing(f"repo {repo}")
                if len(parts) >= 5 and parts[4] == "tree":
                    return self._json([self._entry(n, p) for n, p in files.items()])
                siblings = []
                for name, p in files.items():
                    entry = self._entry(name, p)
                    siblings.append(
                        {
                            "rfilename": name,
                            "size": entry["size"],
                            "blobId": entry["oid"],
                            **(
                                {"lfs": {"sha256": entry["lfs"]["oid"], "size": entry["size"], "pointerSize": 134}}
                                if "lfs" in entry
                                else {}
                            ),
                        }
                    )  # type: ignore[index]
                return self._json(
                    {
                        "id": repo,
                        "modelId": repo,
                        "sha": hub.commit,
                        "private": False,
                        "siblings": siblings,
                        "tags": [],
                        "downloads": 0,
                        "likes": 0,
                    }
                )
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                file = hub.files(repo).get(name)
                if file is None:
                    return self._missing(f"{repo}/{name}")
                return self._file(name, file, body)
            return self._missing(path)

        def _file(self, name: str, file: Path, body: bool) -> None:
            size = file.stat().st_size
            start, end = 0, size
            rng = None if name in hub.ignore_range else self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                first, _, last = rng[6:].partition("-")
                start, end = int(first or 0), min(int(last) + 1 if last else size, size)
            self.send_response(206 if rng else 200)
            self.send_header("X-Repo-Commit", hub.commit)
            self.send_header("Accept-Ranges", "bytes")
            etag = hub.etags.get(name) or (
                _sha256(file) if size >= LFS_FROM_BYTES else hashlib.sha1(file.read_bytes()).hexdigest()
            )
            self.send_header("ETag", f'"{etag}"')
            if size >= LFS_FROM_BYTES:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(size))
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            if not body:
                return
            time.sleep(hub.slow.get(name, 0.0))
            stall = hub.stall_after.get(name)
            if stall is None or stall >= end:
                self._send(file, start, end)
                return
            del hub.stall_after[name]
            self._send(file, start, stall)
            self.wfile.flush()
            hub._stopping.wait(120)  # the client is killed meanwhile
            self.close_connection = True

        def _send(self, file: Path, start: int, end: int) -> None:
            with file.open("rb") as f:
                f.seek(start)
                while start < end:
                    chunk = f.read(min(1 << 20, end - start))
                    try:
                        self.wfile.write(chunk)
                    except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: a reply cut off
                        self.close_connection = True
                        return
                    start += len(chunk)

    return Handler
