"""A recorded agent session: the requests a real agent client sent, in order, as they reached the service. The agent
clients' test records one from its Claude Code run (`.cache/agent-sessions/`, RECORDED); a copy kept in
bench/requests/ (KEPT) is what `make bench-peer` replays against both servers (bench/parts/replay.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.server import REPO

RECORDED = REPO / ".cache" / "agent-sessions"
KEPT = REPO / "bench" / "requests"
# Where the recording names the checkout (the client's home under .cache/), a path of no machine in particular.
CHECKOUT = "/srv/cpu-llm-service"


@dataclass(frozen=True)
class Session:
    client: str  # the npm package's short name, e.g. claude-code
    version: str  # the client's version, as the tests pin it (mk/agents.mk)
    requests: tuple[dict[str, Any], ...]  # each {"path": "/v1/messages", "body": {...}}, in the order sent


def file_name(client: str, version: str) -> str:
    return f"{client}-{version}-session.json"


def save(session: Session, folder: Path = RECORDED) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(session.client, session.version)
    record = {"client": session.client, "version": session.version, "requests": list(session.requests)}
    path.write_text(json.dumps(record, indent=1).replace(str(REPO), CHECKOUT) + "\n")
    return path


def load(path: Path) -> Session:
    record = json.loads(path.read_text())
    return Session(record["client"], record["version"], tuple(record["requests"]))
