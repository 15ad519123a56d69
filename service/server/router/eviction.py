"""Which engine stops so that another model can load: the least recently used of those idle and not pinned. An
engine with requests in flight, a pinned one, or one still loading or stopping is never chosen."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Running:
    name: str
    state: str  # "loading", "loaded" or "stopping"
    pinned: bool
    in_flight: int
    last_used: float  # time.monotonic() of its last request's end (or its load)


@dataclass(frozen=True)
class Room:
    load: bool  # a load may start now
    stop: str | None  # the engine to stop first (then look again)
    why: str


def room_for_load(running: Sequence[Running], engines: int) -> Room:
    """Whether one more engine may load beside `running`, with at most `engines` at once."""
    if len(running) < engines:
        return Room(True, None, f"{len(running)} of {engines} engine(s) running")
    idle = [r for r in running if r.state == "loaded" and not r.pinned and r.in_flight == 0]
    if idle:
        victim = min(idle, key=lambda r: r.last_used)
        return Room(
            False, victim.name, f"{engines} engine(s) running: {victim.name} is the least recently used idle one"
        )
    if any(r.state == "stopping" for r in running):
        return Room(False, None, "an engine is stopping")
    busy = ", ".join(
        f"{r.name} ({'pinned' if r.pinned else r.state if r.state != 'loaded' else f'{r.in_flight} in flight'})"
        for r in running
    )
    return Room(False, None, f"all {engines} engine(s) the memory plan holds are in use: {busy}")
