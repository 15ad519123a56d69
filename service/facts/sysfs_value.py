"""One value from a kernel file (sysfs, cgroupfs): text that does not parse is an error naming the file.

A recorded tree, a container's bind mount or a kernel's odd build can hold anything; "invalid literal for int()"
without the file's name leaves the user nothing to look at.
"""

from __future__ import annotations

from pathlib import Path

from service.facts.cpulist import parse_cpulist


def whole_number(path: Path, value: str) -> int:
    """`value` (read from `path`, stripped) as an int."""
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{path} holds {value!r}, not a whole number") from None


def cpu_list(path: Path, value: str) -> frozenset[int]:
    """`value` (read from `path`) in the kernel's CPU list syntax ("0-3,5")."""
    try:
        return parse_cpulist(value)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
