"""Parsing of vllm.benchmarks.serve results, paired estimates with 95% intervals, verdicts and summary lines."""

from __future__ import annotations

import math
import statistics

import pytest

from bench.stats import (
    CPU,
    FRONTEND_TARGETS,
    DecodeResult,
    Target,
    compare,
    decode_line,
    estimate,
    extract_metrics,
    faster_dtype,
    headline,
    median_metrics,
    paired_samples,
    ratio,
    summary_line,
    t975,
    verdict,
)


def serve_result(req_s: float, tok_s: float, ttft: float, tpot: float, **extra) -> dict:
    """The shape vllm.benchmarks.serve returns with --metric-percentiles 50,99 (plus arrays we drop)."""
    out = {
        "duration": 10.0,
        "completed": 16,
        "failed": 0,
        "request_throughput": req_s,
        "output_throughput": tok_s,
        "p50_ttft_ms": ttft,
        "p99_ttft_ms": ttft * 2,
        "p50_tpot_ms": tpot,
        "p99_tpot_ms": tpot * 1.5,
        "p50_itl_ms": tpot,
        "median_ttft_ms": ttft,
        "total_output_tokens": 1024,
        "ttfts": [0.1] * 16,
        "generated_texts": ["x"] * 16,
    }
    out.update(extra)
    return out


def run(
    server: str,
    c: int,
    rep: int,
    tok_s: float,
    ttft: float = 50.0,
    rnd: int = 0,
    cpu: float | None = None,
    starved: bool = False,
) -> dict:
    metrics = extract_metrics(serve_result(tok_s / 64, tok_s, ttft, 10.0))
    if cpu is not None:
        metrics[CPU] = cpu
    return {
        "server": server,
        "concurrency": c,
        "rep": rep,
        "round": rnd,
        "metrics": metrics,
        "client": {"starved": starved},
    }


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


def test_median_and_ratio():
    assert median_metrics([{"x": 10.0}, {"x": 11.0}, {"x": 2.0}]) == {"x": 10.0}
    with pytest.raises(ValueError):
        median_metrics([])
    assert ratio(1.0, 2.0) == 0.5
    with pytest.raises(ValueError):
        ratio(1.0, 0.0)


def test_t_interval_on_log_ratios():
    samples = [0.97, 1.01, 0.99, 1.03]
    e = estimate("output_throughput", "ratio", samples)
    logs = [math.log(s) for s in samples]
    half = t975(3) * statistics.stdev(logs) / 2
    assert e.value == pytest.approx(math.exp(statistics.fmean(logs)))
    assert e.low == pytest.approx(math.exp(statistics.fmean(logs) - half))
    assert e.high == pytest.approx(math.exp(statistics.fmean(logs) + half))
    assert e.low < e.value < e.high and e.n == 4
    assert t975(1) == pytest.approx(12.706) and t975(100) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_one_repetition_has_no_interval_and_stays_unresolved():
    e = estimate("output_throughput", "ratio", [1.5])
    assert e.low is None and e.high is None
    assert verdict(e, Target("output_throughput", "ratio", ">=", 0.98)) == "unresolved"
    assert "no interval" in e.fmt()


def test_verdict_needs_the_whole_interval_on_one_side():
    at_least = Target("output_throughput", "ratio", ">=", 0.98)
    assert verdict(estimate("x", "ratio", [1.00, 1.01, 1.02]), at_least) == "met"
    assert verdict(estimate("x", "ratio", [0.90, 0.91, 0.92]), at_least) == "missed"
    assert verdict(estimate("x", "ratio", [0.90, 1.05, 1.00]), at_least) == "unresolved"
    at_most = Target("ttft_p50_ms", "delta", "<=", 5.0)
    assert verdict(estimate("x", "delta", [1.0, 2.0, 1.5]), at_most) == "met"
    assert verdict(estimate("x", "delta", [9.0, 10.0, 11.0]), at_most) == "missed"
    assert verdict(estimate("x", "delta", [0.0, 10.0, 4.0]), at_most) == "unresolved"


def test_paired_samples_average_the_rounds_of_each_repetition():
    runs = [
        run("ours", 4, 0, 90.0, rnd=0),
        run("vllm", 4, 0, 100.0, rnd=0),
        run("ours", 4, 0, 110.0, rnd=1),
        run("vllm", 4, 0, 100.0, rnd=1),
        run("ours", 4, 1, 100.0, ttft=60.0),
        run("vllm", 4, 1, 100.0, ttft=50.0),
    ]
    got = paired_samples(runs, "ours", "vllm", "output_throughput", "ratio")
    assert got == pytest.approx([math.sqrt(0.9 * 1.1), 1.0])
    assert paired_samples(runs, "ours", "vllm", "ttft_p50_ms", "delta") == pytest.approx([0.0, 10.0])


def test_compare_estimates_verdicts_and_summary():
    runs = []
    for rep, (a, b, ca, cb) in enumerate(
        [(99.0, 100.0, 30.0, 27.0), (101.0, 100.0, 31.0, 28.0), (100.0, 100.0, 29.0, 27.0)]
    ):
        runs += [run("ours", 4, rep, a, ttft=51.0, cpu=ca), run("vllm", 4, rep, b, ttft=50.0, cpu=cb, starved=rep == 2)]
    runs.append(run("ours", 1, 0, 1.0))  # another concurrency: not mixed in
    c = compare("frontend", "ours", "vllm", 4, runs, FRONTEND_TARGETS)
    assert c.repetitions == 3 and c.starved_runs == 1
    assert c.throughput.value == pytest.approx(1.0, abs=0.01)
    assert c.verdicts["output_throughput"] == "unresolved"  # 3 reps of +-1%: the interval crosses 0.98
    assert c.verdicts["ttft_p50_ms"] == "met"  # +1 ms every time: no spread, within +5 ms
    assert c.verdicts["tpot_p50_ms"] == "met"
    assert c.verdicts[CPU] == "missed"  # ~x1.09 in every repetition: above 1.0
    assert c.overall == "missed"
    line = summary_line(c)
    assert line.startswith("frontend c=4 ours/vllm (n=3; 1 run(s) with a starved load generator): out tok/s x")
    assert "unresolved (out tok/s >= x0.98)" in line and "API CPU/req x1.09" in line
    assert c.as_dict()["overall"] == "missed"


def test_compare_needs_both_sides():
    with pytest.raises(ValueError, match="vllm"):
        compare("frontend", "ours", "vllm", 4, [run("ours", 4, 0, 1.0)])


def test_headline_is_the_worst_front_end_ratio_with_its_interval():
    runs = [run("ours", 1, r, 100.0) for r in range(2)] + [run("vllm", 1, r, 100.0) for r in range(2)]
    runs += [run("ours", 4, 0, 96.0), run("vllm", 4, 0, 100.0), run("ours", 4, 1, 98.0), run("vllm", 4, 1, 100.0)]
    comps = [compare("frontend", "ours", "vllm", c, runs, FRONTEND_TARGETS) for c in (1, 4)]
    line = headline(comps + [compare("policy", "ours", "vllm", 1, runs)])
    assert line.startswith("frontend throughput ratio ours/vllm: 0.970 [")
    assert line.endswith("(worst of c=1,4: c=4)")
    with pytest.raises(ValueError):
        headline([])


def test_decode_fraction_of_the_bandwidth_ceiling():
    d = DecodeResult("bfloat16", tpot_p50_ms=200.0, bandwidth_gbs=10.0, bytes_per_token=1_000_000_000)
    assert d.tokens_per_s == pytest.approx(5.0)
    assert d.ceiling_tokens_per_s == pytest.approx(10.0)
    assert d.fraction == pytest.approx(0.5)
    assert d.effective_gbs == pytest.approx(5.0)
    assert "= 50%: unresolved (target >= 80%)" in decode_line(d)  # one probe: no interval, nothing decided
    assert d.as_dict()["fraction_interval"] is None
    fp32 = DecodeResult("float32", tpot_p50_ms=350.0, bandwidth_gbs=10.0, bytes_per_token=2_000_000_000)
    assert faster_dtype([d, fp32]) == "bfloat16"


def test_asked_output_lengths_recompute_throughput_and_tpot_from_the_chunk_times():
    """llama-server's usage sits in its last chunk, which vLLM's client skips: it re-tokenizes the text and counts
    fewer tokens. With the asked length, TPOT is the time after the first chunk over the remaining tokens."""
    from bench.stats import extract_metrics, with_asked_output_lengths

    result = {
        "request_throughput": 0.5,
        "output_throughput": 1.0,  # what the client computed from its own (wrong) counts
        "p50_ttft_ms": 100.0,
        "p99_ttft_ms": 200.0,
        "p50_tpot_ms": 999.0,
        "p99_tpot_ms": 999.0,
        "p50_itl_ms": 10.0,
        "duration": 4.0,
        "completed": 2,
        "failed": 0,
        "total_output_tokens": 4,
        "ttfts": [0.1, 0.2],
        "itls": [[0.1, 0.1, 0.1], [0.2, 0.2, 0.2]],
    }
    fixed = extract_metrics(with_asked_output_lengths(result, 4))
    assert fixed["total_output_tokens"] == 8
    assert fixed["output_throughput"] == 2.0
    assert round(fixed["tpot_p50_ms"], 6) == 150.0  # requests at 100 and 200 ms per token
    assert round(fixed["tpot_p99_ms"], 6) == 199.0
    assert fixed["ttft_p50_ms"] == 100.0 and fixed["itl_p50_ms"] == 10.0


def test_decode_fraction_is_decided_by_the_interval_over_rounds():
    """Each round is its own rate over the ceiling of the probes around it; the target is met or missed only when the
    whole 95% interval over rounds is on one side of 80%."""
    met = DecodeResult("bfloat16", 100.0, 10.0, 1_000_000_000, (0.81, 0.82, 0.83, 0.82))
    assert met.target_verdict == "met" and met.fraction_estimate is not None
    assert met.fraction_estimate.low is not None and met.fraction_estimate.low > 0.80
    assert "over 4 rounds: met (target >= 80%)" in decode_line(met)
    assert met.as_dict()["fraction_interval"][0] == pytest.approx(met.fraction_estimate.low)
    missed = DecodeResult("bfloat16", 100.0, 10.0, 1_000_000_000, (0.74, 0.75, 0.73))
    assert missed.target_verdict == "missed"
    straddles = DecodeResult("bfloat16", 100.0, 10.0, 1_000_000_000, (0.76, 0.84, 0.79, 0.82))
    assert straddles.target_verdict == "unresolved"
