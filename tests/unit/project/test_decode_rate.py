"""The answer-length model the drain and disconnect tests size their requests with (tests/support/decode_rate.py)."""

from __future__ import annotations

import pytest

from tests.support.decode_rate import StreamTiming

# Measured on a Zen 5 guest, one of three demo-model streams: 582 tok/s near the start, 266 tok/s 2000 positions in.
ZEN5 = StreamTiming(near_s=1 / 582, far_s=1 / 266, far_context=2000)


def test_a_length_sized_for_some_seconds_decodes_in_those_seconds():
    n = ZEN5.tokens_for(15, ceiling=100_000, floor=1)
    assert ZEN5.seconds(n) == pytest.approx(15, rel=0.01)
    # The first rate alone would have asked for 8730 tokens; the growing cost per token keeps it far shorter.
    assert n < 15 * 582 / 2


def test_the_answer_that_ran_58_seconds_is_predicted_long():
    """8037 tokens, sized "for 15 s" from the near rate, ran 58 s in CI on that guest: the model says so (within
    the rate measured 4000 positions in, 132 tok/s, which it underestimates)."""
    assert 40 < ZEN5.seconds(8037) < 70


def test_noise_that_makes_far_tokens_look_cheaper_is_taken_as_flat():
    noisy = StreamTiming(near_s=0.01, far_s=0.008, far_context=2000)
    assert noisy.growth == 0
    assert noisy.tokens_for(15, ceiling=100_000, floor=1) == 1500


def test_floor_and_ceiling_hold():
    assert ZEN5.tokens_for(0.01, ceiling=8000) == 512
    assert ZEN5.tokens_for(10_000, ceiling=8000) == 8000
