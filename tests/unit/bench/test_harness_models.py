"""harness/models.py: the bench model."""

from __future__ import annotations

from harness import models


def test_bench_model_is_bandwidth_bound_size():
    assert 0.45e9 < models.parameters() < 0.55e9
    # every weight but the input embedding table is read once per decoded token
    embed = models.CONFIG["vocab_size"] * models.CONFIG["hidden_size"]
    assert models.bytes_per_token(2) == (models.parameters() - embed) * 2
    assert models.bytes_per_token(4) == 2 * models.bytes_per_token(2)
