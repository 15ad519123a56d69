"""Which listed model a request's `model` names: a model's own name first, then the aliases (names or glob
patterns) in the table's order, so a pattern never takes a name another model has."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence


def listed_name(requested: str, aliases: Mapping[str, Sequence[str]]) -> str | None:
    """`aliases`: each listed model's name -> its aliases, in the table's order."""
    if requested in aliases:
        return requested
    for name, patterns in aliases.items():
        if any(fnmatch.fnmatchcase(requested, pattern) for pattern in patterns):
            return name
    return None
