"""bench/context.py: the A/B engine's order of runs, and run lengths."""

from __future__ import annotations

import pytest

from bench.__main__ import options, parser
from bench.context import Side, round_order


def test_rounds_alternate_the_order_so_a_drift_weighs_on_both_sides():
    a, b = Side("a", lambda p: None), Side("b", lambda p: None)  # type: ignore[arg-type,return-value]
    orders = [[s.name for s in round_order((a, b), rnd)] for rnd in range(4)]
    assert orders == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert [s.name for s in round_order((b, a), 1)] == ["a", "b"]


@pytest.mark.parametrize(
    "opts", [options(parser().parse_args(argv)) for argv in ([], ["--quick"])], ids=["full", "quick"]
)
def test_runs_are_short_and_rounds_even(opts):
    """A run of a few waves of requests (~1-2 s: the machine's speed drifts over longer ones), an even number of rounds
    so each server runs first as often as second."""
    assert opts.rounds % 2 == 0
    for c in opts.concurrencies:
        assert 2 * c <= opts.num_prompts(c) <= 4 * c
