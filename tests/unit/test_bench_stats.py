"""Parsing of vllm.benchmarks.serve results, medians, ratios, verdicts and summary lines of the bench."""
from __future__ import annotations

import pytest

from service.bench.stats import (
    DecodeResult,
    compare,
    decode_line,
    extract_metrics,
    faster_dtype,
    headline,
    median_metrics,
    ratio,
    summary_line,
)


def serve_result(req_s: float, tok_s: float, ttft: float, tpot: float, **extra) -> dict:
    """The shape vllm.benchmarks.serve returns with --metric-percentiles 50,99 (plus arrays we drop)."""
    out = {
        "duration": 10.0, "completed": 16, "failed": 0, "request_throughput": req_s, "output_throughput": tok_s,
        "p50_ttft_ms": ttft, "p99_ttft_ms": ttft * 2, "p50_tpot_ms": tpot, "p99_tpot_ms": tpot * 1.5,
        "p50_itl_ms": tpot, "median_ttft_ms": ttft, "ttfts": [0.1] * 16, "generated_texts": ["x"] * 16,
    }
    out.update(extra)
    return out


def run(server: str, c: int, rep: int, req_s: float, ttft: float = 50.0) -> dict:
    return {"server": server, "concurrency": c, "rep": rep, "metrics": extract_metrics(serve_result(req_s, req_s * 64, ttft, 10.0))}


def test_extract_keeps_scalars_under_our_names():
    m = extract_metrics(serve_result(2.0, 128.0, 40.0, 9.0))
    assert m["request_throughput"] == 2.0 and m["output_throughput"] == 128.0
    assert m["ttft_p50_ms"] == 40.0 and m["ttft_p99_ms"] == 80.0
    assert m["tpot_p50_ms"] == 9.0 and m["tpot_p99_ms"] == 13.5
    assert "ttfts" not in m and "generated_texts" not in m


def test_extract_names_missing_percentiles():
    result = serve_result(2.0, 128.0, 40.0, 9.0)
    del result["p99_tpot_ms"]
    with pytest.raises(ValueError, match="p99_tpot_ms"):
        extract_metrics(result)


def test_median_is_robust_to_one_disturbed_repetition():
    runs = [{"x": 10.0}, {"x": 11.0}, {"x": 2.0}]
    assert median_metrics(runs) == {"x": 10.0}
    with pytest.raises(ValueError):
        median_metrics([])


def test_ratio_refuses_a_zero_baseline():
    assert ratio(1.0, 2.0) == 0.5
    with pytest.raises(ValueError):
        ratio(1.0, 0.0)


def test_compare_pairs_by_repetition_and_checks_targets():
    runs = [
        run("ours", 4, 0, 9.9, ttft=52.0), run("vllm", 4, 0, 10.0, ttft=50.0),
        run("ours", 4, 1, 10.1, ttft=51.0), run("vllm", 4, 1, 10.0, ttft=50.0),
        run("ours", 4, 2, 9.0, ttft=60.0), run("vllm", 4, 2, 10.0, ttft=50.0),
        run("ours", 1, 0, 1.0), run("vllm", 1, 0, 2.0),  # another concurrency: not mixed in
    ]
    c = compare("frontend", "ours", "vllm", 4, runs)
    assert c.repetitions == 3
    assert c.request_ratio == pytest.approx(0.99)  # median 9.9 / median 10.0
    assert c.output_ratio == pytest.approx(0.99)
    assert c.paired_output_ratios == pytest.approx((0.99, 1.01, 0.9))
    assert c.ttft_p50_delta_ms == pytest.approx(2.0)
    assert c.throughput_ok and c.ttft_ok
    line = summary_line(c)
    assert line.startswith("frontend c=4 ours/vllm: req/s x0.990")
    assert "pairs 0.900-1.010" in line and "[OK;" in line


def test_compare_flags_below_target():
    runs = [run("ours", 16, 0, 9.0, ttft=70.0), run("vllm", 16, 0, 10.0, ttft=50.0)]
    c = compare("frontend", "ours", "vllm", 16, runs)
    assert not c.throughput_ok and not c.ttft_ok
    assert "BELOW TARGET" in summary_line(c)
    assert c.as_dict()["throughput_ratio"] == pytest.approx(0.9)


def test_compare_needs_both_sides():
    with pytest.raises(ValueError, match="vllm"):
        compare("frontend", "ours", "vllm", 4, [run("ours", 4, 0, 1.0)])


def test_headline_is_the_worst_front_end_ratio():
    runs = [run("ours", 1, 0, 1.0), run("vllm", 1, 0, 1.0), run("ours", 4, 0, 0.97), run("vllm", 4, 0, 1.0)]
    comps = [compare("frontend", "ours", "vllm", c, runs) for c in (1, 4)]
    comps.append(compare("policy", "ours", "vllm", 1, runs))
    assert headline(comps).startswith("frontend throughput ratio ours/vllm: 0.970")
    with pytest.raises(ValueError):
        headline(comps[2:])


def test_decode_fraction_of_the_bandwidth_ceiling():
    d = DecodeResult("bfloat16", tpot_p50_ms=200.0, bandwidth_gbs=10.0, bytes_per_token=1_000_000_000)
    assert d.tokens_per_s == pytest.approx(5.0)
    assert d.ceiling_tokens_per_s == pytest.approx(10.0)
    assert d.fraction == pytest.approx(0.5)
    assert d.effective_gbs == pytest.approx(5.0)
    assert "= 50%" in decode_line(d) and "BELOW TARGET" in decode_line(d)
    fp32 = DecodeResult("float32", tpot_p50_ms=350.0, bandwidth_gbs=10.0, bytes_per_token=2_000_000_000)
    assert faster_dtype([d, fp32]) == "bfloat16"
    assert fp32.fraction == pytest.approx((1000 / 350) / 5)
