"""The measurement store is the one source of every figure: each row names where it comes from, the policy cites
rows by key, and no reason string in the product holds a date."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.measurements.store import read_store, store

ROOT = Path(__file__).resolve().parents[3]
SERVICE = ROOT / "service"
DATE = re.compile(r"20[0-9][0-9]-[01][0-9]-")


def test_every_row_names_where_it_comes_from():
    rows = store().rows.values()
    assert rows
    for r in rows:
        assert r.command and r.machine and r.cpu, r.key
        assert re.fullmatch(r"20\d\d-\d\d-\d\d( \d\d:\d\d)?", r.date), r.key


def test_a_key_twice_is_refused(tmp_path):
    line = "- {key: claim/x, cpu: zen4, machine: m, command: c, date: 2026-01-01}\n"
    (tmp_path / "a.yaml").write_text(line + line)
    with pytest.raises(ValueError, match="claim/x"):
        read_store(tmp_path)


def test_every_key_the_product_cites_is_in_the_store():
    cited = set()
    for path in SERVICE.rglob("*.py"):
        cited |= set(re.findall(r"""(?:cite|row)\(\s*f?["']([\w./-]+)["']""", path.read_text()))
    literal = {k for k in cited if "{" not in k}
    assert literal, "no citation found: the pattern no longer matches the code"
    assert literal <= set(store().rows), literal - set(store().rows)


def test_every_key_a_comment_or_docstring_names_is_in_the_store():
    """Code and tests cite a figure by its row's key, in prose too: a key that names no row is a figure gone missing."""
    key = re.compile(r"\b(?:claim|quality)/[a-z0-9][\w.-]*(?:/[\w.-]*[\w])+")
    named = {
        (p.relative_to(ROOT).as_posix(), k)
        for folder in (SERVICE, ROOT / "tests", ROOT / "bench")
        for p in folder.rglob("*.py")
        for k in key.findall(p.read_text())
        if "{" not in k
    }
    assert named, "no key named: the pattern no longer matches"
    assert {(p, k) for p, k in named if k not in store().rows} == set()


def test_no_reason_string_in_the_product_holds_a_date():
    """Dates live in the store's rows; code cites them by key."""
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in SERVICE.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if DATE.search(line)
    ]
    assert found == []
