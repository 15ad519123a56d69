"""bench/tables.py: comparison and decode tables."""

from __future__ import annotations

import pytest

from bench.tables import comparison_table
from tests.unit.bench.bench_results import frontend_comparisons


@pytest.fixture
def comparisons():
    return frontend_comparisons()


def test_table_shows_medians_estimates_intervals_and_verdicts(comparisons):
    lines = comparison_table(comparisons).splitlines()
    assert (
        lines[0]
        == "| comparison | c | n | servers | out tok/s | TTFT p50 ms | TPOT p50 ms | API CPU ms/req | verdict |"
    )
    assert len(lines) == 2 + 2
    assert lines[2].startswith("| frontend | 4 | 2 | ours / vllm | 129.0 / 127.0: **x1.016 [")
    assert "30.0 / 29.0: **+1.00 [+1.00, +1.00]** met" in lines[2]
    assert lines[3].endswith("| unresolved |")  # one repetition: no interval, nothing decided
    assert "[n=1, no interval]" in lines[3]
