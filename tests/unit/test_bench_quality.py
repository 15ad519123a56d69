"""bench/quality.py scores the tokens llama-perplexity scores."""

from __future__ import annotations

from bench.quality import chunks_of, second_half


def test_chunks_are_llama_perplexitys():
    ids = list(range(100, 110))
    assert chunks_of(ids, 4, bos=None) == [[100, 101, 102, 103], [104, 105, 106, 107]]  # a partial chunk is dropped
    assert chunks_of(ids, 4, bos=1) == [[1, 101, 102, 103], [1, 105, 106, 107]]


def test_the_second_half_of_a_chunk_is_scored():
    # logprobs[k] is the logprob of token k + 1; llama-perplexity scores tokens first + 1 .. ctx - 1, first = ctx / 2.
    ctx = 8
    logprobs = [float(token) for token in range(1, ctx)]
    assert second_half(logprobs, ctx) == [5.0, 6.0, 7.0]
