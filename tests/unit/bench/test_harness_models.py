"""harness/models.py: the bench model."""

from __future__ import annotations

from harness import models


def test_bench_model_is_bandwidth_bound_size():
    assert 0.45e9 < models.parameters() < 0.55e9
    # every weight but the input embedding table is read once per decoded token
    embed = models.CONFIG["vocab_size"] * models.CONFIG["hidden_size"]
    assert models.bytes_per_token(2) == (models.parameters() - embed) * 2
    assert models.bytes_per_token(4) == 2 * models.bytes_per_token(2)


def test_the_size_sweep_models_have_the_sizes_they_are_named_after():
    # Without the real checkpoints' 128-152 k-row embedding and head: their decoders' parameter counts
    for size, (low, high) in {"1.5b": (1.2e9, 1.4e9), "3b": (2.6e9, 2.9e9)}.items():
        cfg = models.SIZES[size]
        assert low < models.parameters(cfg) < high, (size, models.parameters(cfg))
        assert cfg["hidden_size"] // cfg["num_attention_heads"] == cfg["head_dim"]
