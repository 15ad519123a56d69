"""The tokens one engine step takes (max_num_batched_tokens): the user's, vLLM's default, or a measured chunk."""

from __future__ import annotations

from service.measurements.store import Row
from service.policy.engine import prefill_chunk
from service.policy.engine.prefill_chunk import VLLM_CPU_DEFAULT, chosen_chunk, plan_prefill_chunk
from service.settings import Settings
from tests.unit.policy.test_policy_engine import decision, hw, plan


def _row(chunk: int, value: float, interval: tuple[float, float]) -> Row:
    return Row(
        key=f"depth/x/f/16384/prefill-chunk-{chunk}",
        cpu="x",
        machine="m",
        command="c",
        date="2026-12-06",
        value=value,
        unit="x",
        interval=interval,
        params={"variant": "chunk", "chunk": str(chunk), "metric": "prefill", "depth": 16384},
    )


def test_a_smaller_chunk_that_prefills_about_as_fast_is_taken_over_a_larger_faster_one():
    rows = [_row(512, 0.97, (0.8, 1.1)), _row(1024, 0.99, (0.9, 1.1)), _row(8192, 1.2, (1.1, 1.3))]
    assert chosen_chunk(rows) is rows[0]


def test_a_smaller_chunk_that_costs_prefill_or_is_surely_slower_is_not_taken():
    assert chosen_chunk([_row(512, 0.90, (0.7, 1.2))]) is None  # its median costs 10%
    assert chosen_chunk([_row(512, 0.97, (0.95, 0.99))]) is None  # surely slower


def test_a_larger_chunk_is_taken_only_where_surely_faster():
    assert chosen_chunk([_row(8192, 1.2, (0.9, 1.5))]) is None
    surely = _row(8192, 1.2, (1.05, 1.4))
    assert chosen_chunk([surely, _row(16384, 1.3, (1.1, 1.5))]) is surely


def test_the_users_chunk_reaches_vllm_as_theirs():
    p = plan(hw(memory=512 * 1024**3), max_model_len=8192, max_num_batched_tokens=512)
    d = decision(p, "engine.max_num_batched_tokens")
    assert (d.value, d.source) == (512, "user") and p.engine_args["max_num_batched_tokens"] == 512


def test_where_nothing_was_measured_vllms_default_is_shown_and_left_to_it(monkeypatch):
    monkeypatch.setattr(prefill_chunk, "MEASURED", {})
    p = plan(hw(memory=512 * 1024**3), max_model_len=8192)
    d = decision(p, "engine.max_num_batched_tokens")
    ranks = p.engine_args.get("tensor_parallel_size", 1)
    assert d.value == VLLM_CPU_DEFAULT * ranks and d.source == "default" and "no other chunk measured" in d.reason
    assert "max_num_batched_tokens" not in p.engine_args


def test_with_chunked_prefill_off_a_step_must_hold_the_longest_prompt():
    off = Settings(enable_chunked_prefill=False, max_num_batched_tokens=4096)
    result = plan_prefill_chunk("amx", off, off.explicitly_set(), False, 16384, 1)
    assert result.errors and "4096" in result.errors[0] and "16384" in result.errors[0]
    result = plan_prefill_chunk("amx", Settings(), frozenset(), False, 16384, 2)
    [d] = result.decisions
    assert d.value == 16384 and not d.passed and "one step" in d.reason


def test_a_users_chunk_below_max_num_seqs_is_refused_before_vllm_would():
    both = Settings(max_num_seqs=256, max_num_batched_tokens=128)
    result = plan_prefill_chunk("amx", both, both.explicitly_set(), True, 8192, 1)
    assert result.errors and "max_num_seqs=256" in result.errors[0]


def test_the_default_scales_with_the_tensor_parallel_ranks_as_vllms_does(monkeypatch):
    monkeypatch.setattr(prefill_chunk, "MEASURED", {})
    [d] = plan_prefill_chunk("avx2", Settings(), frozenset(), True, 8192, 2).decisions
    assert d.value == 2 * VLLM_CPU_DEFAULT and not d.passed


def test_a_measured_chunk_is_handed_to_vllm_with_its_measurement_and_holds_every_running_sequence(monkeypatch):
    measured = _row(512, 0.98, (0.9, 1.1))
    monkeypatch.setattr(prefill_chunk, "MEASURED", {"amx": (measured.key,)})
    monkeypatch.setattr(prefill_chunk, "row", lambda key: measured)
    monkeypatch.setattr(prefill_chunk, "cite", lambda key: f"cited {key}")
    [d] = plan_prefill_chunk("amx", Settings(), frozenset(), True, 8192, 1).decisions
    assert (d.value, d.source, d.passed) == (512, "policy", True) and f"cited {measured.key}" in d.reason
    [d] = plan_prefill_chunk("amx", Settings(max_num_seqs=1024), frozenset(), True, 8192, 1).decisions
    assert d.value == 1024
    [d] = plan_prefill_chunk("avx2", Settings(), frozenset(), True, 8192, 1).decisions
    assert (d.value, d.passed) == (VLLM_CPU_DEFAULT, False)  # measured on another backend only
