"""The GGUF check's verdict (service/policy/gguf/gguf_check.py) from llama.cpp's reference and the engine's scores."""

from __future__ import annotations

import pytest

from service.policy.gguf.gguf_check import MEAN_BOUND, judge

REFERENCE = {
    "text": "a b c d",
    "tokens": [1, 10, 11, 12, 13],
    "logprobs": [-2.0, -1.0, -0.5, -3.0],
    "top": [10, 11, 12, 9],
}


def shifted(by: float) -> list[float]:
    return [x + by for x in REFERENCE["logprobs"]]


def test_scores_within_the_bound_pass_with_their_figures():
    verdict = judge(REFERENCE, shifted(MEAN_BOUND / 2), REFERENCE["tokens"], "refuse", [10, 11, 12, 13])
    assert verdict.ok and verdict.passed
    assert f"{MEAN_BOUND / 2:.3f} on average" in verdict.reason and "the same at 3 of 4" in verdict.reason


def test_scores_beyond_the_bound_refuse_and_name_the_way_out():
    verdict = judge(REFERENCE, shifted(MEAN_BOUND * 2), REFERENCE["tokens"], "refuse")
    assert not verdict.ok and verdict.passed is False
    assert "differ from llama.cpp's" in verdict.reason and "gguf_check=warn" in verdict.reason


def test_one_position_far_off_counts_by_its_share_of_the_mean():
    engine = list(REFERENCE["logprobs"])
    engine[2] -= MEAN_BOUND * len(engine) * 1.5  # alone it moves the mean past the bound
    assert not judge(REFERENCE, engine, REFERENCE["tokens"], "refuse").ok
    engine = list(REFERENCE["logprobs"])
    engine[2] -= MEAN_BOUND * len(engine) * 0.5
    assert judge(REFERENCE, engine, REFERENCE["tokens"], "refuse").passed


def test_warn_serves_a_disagreement_and_says_so():
    verdict = judge(REFERENCE, shifted(MEAN_BOUND * 2), REFERENCE["tokens"], "warn")
    assert verdict.ok and verdict.passed is False and "served anyway" in verdict.reason


def test_a_tokenizer_that_splits_the_text_otherwise_refuses_at_the_first_difference():
    verdict = judge(REFERENCE, shifted(0.0), [1, 10, 99, 12, 13], "refuse")
    assert not verdict.ok and "token 2" in verdict.reason and "[99, 12, 13]" in verdict.reason
    # A tokenizer without the BOS llama.cpp puts first differs at token 0.
    assert "token 0" in judge(REFERENCE, shifted(0.0), [10, 11, 12, 13], "refuse").reason


def test_a_missing_position_refuses():
    assert not judge(REFERENCE, shifted(0.0)[:-1], REFERENCE["tokens"], "refuse").ok


@pytest.mark.parametrize("mode", ["refuse", "warn"])
def test_no_reference_is_a_named_check_not_run(mode):
    verdict = judge({"unavailable": "no llama.cpp source tree"}, None, None, mode)
    assert verdict.ok and verdict.passed is None and "no llama.cpp source tree" in verdict.reason


def test_off_runs_nothing_and_says_so():
    verdict = judge(REFERENCE, None, None, "off")
    assert verdict.ok and verdict.passed is None and "gguf_check=off" in verdict.reason
