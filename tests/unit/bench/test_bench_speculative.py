"""bench/speculative.py: which server each variant is, and what its ratios compare."""

from __future__ import annotations

from bench.speculative import (
    HEADLINE,
    PEER_VARIANTS,
    RATIOS,
    SUFFIX_HEADLINE,
    SUFFIX_PEER_VARIANTS,
    SUFFIX_VARIANTS,
    VARIANTS,
    served_names,
)


def test_each_variant_of_ours_is_asked_for_our_model_and_each_peer_for_its_own():
    ours = [*VARIANTS, *SUFFIX_VARIANTS]
    names = served_names(ours, [*ours, *PEER_VARIANTS, *SUFFIX_PEER_VARIANTS], "peer")
    assert {v for v, n in names.items() if n == "bench"} == set(ours)
    assert {v for v, n in names.items() if n == "peer"} == {*PEER_VARIANTS, *SUFFIX_PEER_VARIANTS}


def test_every_ratio_compares_variants_that_run_and_the_headlines_are_ratios():
    known = {*VARIANTS, *SUFFIX_VARIANTS, *PEER_VARIANTS, *SUFFIX_PEER_VARIANTS}
    assert all(a in known and b in known and a != b for a, b in RATIOS)
    assert {HEADLINE, SUFFIX_HEADLINE} <= {f"{a}/{b}" for a, b in RATIOS}
