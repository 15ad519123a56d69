from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.facts.cpulist import CpuListError, format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,5", {0, 1, 2, 3, 5}),
        ("0-7,16-23\n", {*range(8), *range(16, 24)}),
        ("  7 ", {7}),
        ("", set()),  # a memory-only NUMA node's cpulist
        ("\n", set()),
        ("2-2", {2}),
        ("5,1,3", {1, 3, 5}),
    ],
)
def test_parse(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [({0, 1, 2, 3, 5}, "0-3,5"), (set(), ""), ({4}, "4"), ({1, 2}, "1-2"), ([9, 8, 8, 0], "0,8-9")],
)
def test_format_compacts_ranges(cpus: set[int], text: str) -> None:
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("3-1", "ends before it starts"),
        ("a", "not a CPU number"),
        ("1,,2", "empty item"),
        ("-1", "not a CPU number"),
        ("1-", "not a CPU number"),
        ("0-3x", "not a CPU number"),
        ("0-3,", "empty item"),
        ("1 2", "not a CPU number"),
        ("\u0663", "not a CPU number"),  # Arabic-Indic digit three: int() would take it
    ],
)
def test_garbage_is_rejected_with_the_text_quoted(text: str, complaint: str) -> None:
    with pytest.raises(CpuListError) as caught:
        parse_cpulist(text)
    assert repr(text) in str(caught.value)
    assert complaint in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_format_rejects_negative_cpus() -> None:
    with pytest.raises(CpuListError, match="negative"):
        format_cpulist({-1, 0})


@given(st.frozensets(st.integers(min_value=0, max_value=4096), max_size=64))
def test_round_trip_from_sets(cpus: frozenset[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == cpus


@given(st.frozensets(st.integers(min_value=0, max_value=512), max_size=64))
def test_format_is_canonical(cpus: frozenset[int]) -> None:
    text = format_cpulist(cpus)
    assert format_cpulist(parse_cpulist(text)) == text
    # No two items could have been merged into one range.
    items = [tuple(map(int, item.split("-"))) for item in text.split(",") if item]
    assert all(later[0] > earlier[-1] + 1 for earlier, later in zip(items, items[1:]))
