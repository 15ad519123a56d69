"""Linux CPU list syntax ("0-3,5"), as used by sysfs, cgroup cpusets and taskset."""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import groupby

_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")  # ASCII digits only, unlike \d


class CpuListError(ValueError):
    """A CPU list that is not in the kernel's "N,N-M" syntax."""


def parse_cpulist(text: str) -> frozenset[int]:
    """ "0-3,5" -> {0, 1, 2, 3, 5}; "" (a memory-only NUMA node in sysfs) -> empty set."""
    stripped = text.strip()
    if not stripped:
        return frozenset()
    cpus: set[int] = set()
    for item in stripped.split(","):
        first, last = _parse_item(text, item)
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def _parse_item(text: str, item: str) -> tuple[int, int]:
    if not item:
        raise CpuListError(f"bad CPU list {text!r}: empty item between commas")
    match = _ITEM.fullmatch(item)
    if match is None:
        raise CpuListError(f"bad CPU list {text!r}: item {item!r} is not a CPU number N or a range N-M")
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if last < first:
        raise CpuListError(f"bad CPU list {text!r}: range {item!r} ends before it starts")
    return first, last


def format_cpulist(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 3, 5} -> "0-3,5": consecutive CPUs collapse into ranges."""
    ordered = sorted(set(cpus))
    if ordered and ordered[0] < 0:
        raise CpuListError(f"CPU numbers cannot be negative: {ordered[0]}")
    # Within a run of consecutive numbers, value minus position is constant.
    runs = (list(run) for _, run in groupby(enumerate(ordered), key=lambda pair: pair[1] - pair[0]))
    return ",".join(_format_run(run[0][1], run[-1][1]) for run in runs)


def _format_run(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"
