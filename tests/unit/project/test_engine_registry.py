"""The engine registry (tests/support/engines.py) against the test sources: every place a test starts the service
names a registered family, every family is started somewhere, and a start past the registered count fails."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import engines
from tests.support.phases import BUDGET_DOC, budgets, read_record, report

TESTS = Path(__file__).resolve().parents[2]
needs_the_budget_doc = pytest.mark.skipif(not BUDGET_DOC.is_file(), reason="docs/ is not in this build context")
TEST_SCRIPT = TESTS.parent / "scripts" / "test.sh"
# Calls that start an engine, and where each takes the engine's name: a positional index or a keyword.
STARTERS = {
    "_start": 0,  # tests/integration/conftest.py
    "start_server": 0,  # tests/reliability/conftest.py
    "start_service": "name",  # tests/support/server.py
    "start_table": "name",  # tests/support/server.py (a model table's front end, its pinned engines loaded)
    "ServerProcess": "name",  # harness/server.py (a service process, where the tests start one themselves)
    "_start_calibrated": 1,  # tests/integration/test_calibration.py
    "engines.started": 0,  # containers and the offline engine
    "running": "engine",  # tests/container/test_images.py (default "image")
}
# Helpers that pass a caller's name on: their own calls are checked where they are called.
FORWARDERS = {"_start", "start_server", "start_service", "start_table", "_start_calibrated", "running", "counted_start"}


def _name_prefix(node: ast.expr) -> str | None:
    """The constant start of a name: "x" for "x" or f"x/{...}", None where it is not written out."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def _engine_starts() -> list[tuple[str, int, str, str | None]]:
    """(file, line, call, the name's written-out start or None) for every starting call outside a forwarder."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.parts[len(TESTS.parts)] == "unit":
            continue  # unit tests start no engine (import-linter); test_bench_harness starts an HTTP server
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = ast.unparse(node.func)
            func = called if called.endswith("engines.started") else called.rsplit(".", 1)[-1]
            if func not in STARTERS or path.name == "engines.py":
                continue
            scope = node
            while scope in parents and not isinstance(scope, ast.FunctionDef):
                scope = parents[scope]
            if isinstance(scope, ast.FunctionDef) and scope.name in FORWARDERS and func != "running":
                continue
            where = STARTERS[func]
            if isinstance(where, int):
                arg = node.args[where] if len(node.args) > where else None
            else:
                arg = next((k.value for k in node.keywords if k.arg == where), None)
            if func == "running" and arg is None:
                found.append((str(path.relative_to(TESTS)), node.lineno, func, "image"))
                continue
            found.append((str(path.relative_to(TESTS)), node.lineno, func, None if arg is None else _name_prefix(arg)))
    return found


def test_every_engine_start_in_the_tests_names_a_registered_family():
    starts = _engine_starts()
    assert len(starts) >= 20, starts  # the scan finds the suite's starts
    unnamed = [s for s in starts if s[3] is None]
    assert not unnamed, f"an engine start whose name is not written out at the call: {unnamed}"
    unregistered = [s for s in starts if engines.family(s[3]) not in engines.ENGINES]
    assert not unregistered, (
        f"register these in tests/support/engines.py, with why no running engine serves: {unregistered}"
    )


def test_every_registered_family_is_started_somewhere():
    used = {engines.family(s[3]) for s in _engine_starts() if s[3]}
    assert set(engines.ENGINES) <= used, f"registered, never started: {set(engines.ENGINES) - used}"


def test_each_family_gives_its_reason_and_a_start_count():
    for name, engine in engines.ENGINES.items():
        assert engine.starts >= 1 and len(engine.why) > 20, name


def test_an_unregistered_engine_or_one_start_too_many_fails_at_the_start(monkeypatch):
    monkeypatch.setattr(engines, "_STARTED", engines.Counter())
    with pytest.raises(engines.UnregisteredEngine, match="not in tests/support/engines.py"):
        engines.started("an-engine-nobody-registered")
    for _ in range(engines.ENGINES["lora"].starts):
        engines.started("lora")
    with pytest.raises(engines.UnregisteredEngine, match="started 2 times, registered for 1"):
        engines.started("lora/again")
    assert engines.counts()["lora"] == 2


@needs_the_budget_doc
def test_the_phase_budgets_cover_every_phase_make_test_runs_and_fit_the_wall_time():
    table = budgets()
    # scripts/test.sh
    streams = (("set-up", "lint", "unit", "integration"), ("set-up", "container", "reliability", "integration-beside"))
    assert {phase for stream in streams for phase in stream} | {"wall"} == set(table), table
    for stream in streams:
        # the slowest CPU met gets 60 minutes, CI's 90 leave room for a slower one
        assert sum(table[phase] for phase in stream) <= table["wall"] <= 60, (stream, table)


@needs_the_budget_doc
def test_the_recorded_phases_and_engine_starts_are_read_back_and_reported(tmp_path):
    path = tmp_path / "phases.tsv"
    path.write_text("set-up\t312\nlint\t58\nunit\t40\nengines\tchat\t1\ncontainer\t9000\nengines\timage\t3\n")
    seconds, starts = read_record(path)
    assert seconds == {"set-up": 312.0, "lint": 58.0, "unit": 40.0, "container": 9000.0}
    assert starts == {"chat": 1, "image": 3}
    assert read_record(tmp_path / "missing") == ({}, {}) and read_record(None) == ({}, {})
    lines = report(seconds, starts, wall=600)
    assert any(line.startswith("container") and line.endswith("OVER") for line in lines), lines
    assert not any(line.startswith("unit") and "OVER" in line for line in lines), lines
    assert lines[-1] == "engine starts: 4 (chat 1, image 3)"


def test_an_integration_file_run_beside_is_a_phase_of_its_own(monkeypatch):
    from types import SimpleNamespace

    from tests.support.phases import MOVED_ENV, phase_of

    moved, reliability = (SimpleNamespace(path=TESTS / p) for p in ("integration/test_x.py", "reliability/test_y.py"))
    assert (phase_of(moved), phase_of(reliability)) == ("integration", "reliability")
    monkeypatch.setenv(MOVED_ENV, "integration")
    assert (phase_of(moved), phase_of(reliability)) == ("integration-beside", "reliability")


@pytest.mark.skipif(not TEST_SCRIPT.is_file(), reason="scripts/ is not in this build context (the test image)")
def test_the_integration_files_run_beside_share_no_engine_of_their_package():
    """scripts/test.sh's `moved`: a file that used a package-scoped server would start it a second time there."""
    import re

    script = TEST_SCRIPT.read_text()
    moved = re.search(r"^moved=\(([^)]*)\)", script, re.M)
    assert moved is not None
    shared = re.findall(
        r'@pytest\.fixture\(scope="package"\)\s*\ndef (\w+)', (TESTS / "integration/conftest.py").read_text()
    )
    assert "default_server" in shared, shared
    for path in moved[1].split():
        tree = ast.parse((TESTS.parent / path).read_text())
        used = {a.arg for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for a in f.args.args}
        used |= {c.value for c in ast.walk(tree) if isinstance(c, ast.Constant)}  # request.getfixturevalue("...")
        assert not used & set(shared), (path, used & set(shared))
