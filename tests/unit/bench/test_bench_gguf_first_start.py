"""bench/tools/gguf_first_start.py on a tiny GGUF file: both ways timed and printed, and its "unshared" way really parses
the header once per caller (what the service did before), so the comparison measures what it says."""

from __future__ import annotations

import re
import sys

from bench.tools import gguf_first_start
from tests.support.gguf_models import tiny_gguf
from tests.support.server import MODELS


def test_both_ways_are_timed(monkeypatch, capsys):
    path = tiny_gguf(MODELS, "llama", "Q8_0")
    monkeypatch.setattr(sys, "argv", ["gguf_first_start", "--model", str(path), "--repetitions", "1"])
    gguf_first_start.main()
    rows = {m[1]: m[2] for m in re.finditer(r"^\| (shared|unshared) \| (.+) \|$", capsys.readouterr().out, re.M)}
    assert set(rows) == {"shared", "unshared"}, rows
    assert all(len(cells.split(" | ")) == 2 for cells in rows.values()), rows


def test_the_unshared_way_parses_per_caller(tmp_path, parses):
    path = tiny_gguf(MODELS, "llama", "Q8_0")
    for way in ("shared", "unshared"):
        (tmp_path / way).mkdir()
    gguf_first_start.first_start(path, tmp_path / "shared")
    shared = len(parses)
    with gguf_first_start.unshared():
        gguf_first_start.first_start(path, tmp_path / "unshared")
    assert (shared, len(parses) - shared) == (2, 4)
