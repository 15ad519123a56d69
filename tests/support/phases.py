"""`make test`'s phase times beside each phase's budget, and the engine starts per family (tests/support/engines.py).

The phases: set-up and lint (timed by make), then pytest's own, one per test directory (unit, integration,
reliability, container; the container tests run beside the others, in a pytest of their own: scripts/test.sh). The
integration files that stream runs too (MOVED_ENV names their directory) are a phase of their own, `integration-beside`,
so that each stream's phases add up to its time.
Every pytest session appends its phases and engine starts to the file TEST_PHASES names (`phase<TAB>seconds`,
`engines<TAB>family<TAB>count`); `python -m tests.support.phases FILE` prints them all at the end. A session without
TEST_PHASES prints its own. The budgets are the table in docs/development.md ("Time budget"), the suite's target on
the slowest CPU met; a phase over its budget is marked, not failed (a timed test fails on a busy machine)."""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.support import engines

REPO = Path(__file__).resolve().parents[2]
BUDGET_DOC = REPO / "docs" / "development.md"
PHASES_ENV = "TEST_PHASES"
MOVED_ENV = "TEST_PHASES_MOVED"  # space-separated test directories whose files this session runs beside their own
_ROW = re.compile(r"^\|\s*`?([\w-]+)`?\s*\|\s*(\d+)\s*\|")


def budgets(doc: Path = BUDGET_DOC) -> dict[str, int]:
    """phase -> minutes, from the table under the "Time budget" heading (none where docs/ is not at hand: the test
    image runs the unit tests without it)."""
    if not doc.is_file():
        return {}
    section = doc.read_text().split("### Time budget", 1)[1].split("\n#", 1)[0]
    return {m[1]: int(m[2]) for line in section.splitlines() if (m := _ROW.match(line))}


def phase_of(item: pytest.Item) -> str:
    """tests/<phase>/...: the test directory an item lives in."""
    parts = Path(str(item.path)).relative_to(REPO).parts
    phase = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    return f"{phase}-beside" if phase in os.environ.get(MOVED_ENV, "").split() else phase


def read_record(path: str | os.PathLike[str] | None) -> tuple[dict[str, float], Counter[str]]:
    """The phases and engine starts recorded in `path` (none where it does not exist)."""
    seconds: dict[str, float] = defaultdict(float)
    starts: Counter[str] = Counter()
    if path and Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            fields = line.split("\t")
            if fields[0] == "engines" and len(fields) == 3:
                starts[fields[1]] += int(fields[2])
            elif len(fields) == 2:
                seconds[fields[0]] += float(fields[1])
    return dict(seconds), starts


def report(seconds: dict[str, float], starts: Counter[str], wall: float | None = None) -> list[str]:
    budget = budgets()
    lines = ["phase times (budget: docs/development.md, the slowest CPU met)"]
    for phase, took in seconds.items():
        limit = budget.get(phase)
        mark = "" if limit is None else f"  budget {limit} min" + ("  OVER" if took > 60 * limit else "")
        lines.append(f"{phase:<12} {took / 60:6.1f} min{mark}")
    if wall is not None:
        over = "  OVER" if wall > 60 * budget.get("wall", 45) else ""
        lines.append(f"{'wall':<12} {wall / 60:6.1f} min  budget {budget.get('wall', 45)} min{over}")
    if starts:
        listed = ", ".join(f"{name} {n}" for name, n in sorted(starts.items()))
        lines.append(f"engine starts: {sum(starts.values())} ({listed})")
    return lines


_SECONDS: dict[str, float] = defaultdict(float)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Setup, call and teardown: the fixtures a phase's first test starts and its last one stops count to it.
    started = time.monotonic()
    yield
    _SECONDS[phase_of(item)] += time.monotonic() - started


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _SECONDS:
        return
    record = os.environ.get(PHASES_ENV)
    if record:
        with open(record, "a") as out:
            out.writelines(f"{phase}\t{took:.0f}\n" for phase, took in _SECONDS.items())
            out.writelines(f"engines\t{name}\t{n}\n" for name, n in engines.counts().items())
        return
    terminalreporter.section("phase times")
    for line in report(dict(_SECONDS), engines.counts())[1:]:
        terminalreporter.write_line(line)


if __name__ == "__main__":  # python -m tests.support.phases FILE [WALL_SECONDS]
    recorded, counted = read_record(sys.argv[1])
    print("\n".join(report(recorded, counted, float(sys.argv[2]) if len(sys.argv) > 2 else None)))
