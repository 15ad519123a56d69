"""Pure arithmetic on benchmark results: the metrics we keep, medians over repetitions, ratios, verdicts."""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# Our name -> the key in the dict vllm.benchmarks.serve returns (run with --metric-percentiles 50,99).
METRIC_KEYS: dict[str, str] = {
    "request_throughput": "request_throughput",
    "output_throughput": "output_throughput",
    "ttft_p50_ms": "p50_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "tpot_p50_ms": "p50_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms",
    "itl_p50_ms": "p50_itl_ms",
    "duration_s": "duration",
    "completed": "completed",
    "failed": "failed",
}
CPU = "api_cpu_ms_per_request"  # added by the runner: CPU time of the API-server process per request
THROUGHPUT = ("request_throughput", "output_throughput")
LATENCY = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")

# Issue 5's targets for the front end.
MIN_THROUGHPUT_RATIO = 0.98
MAX_TTFT_P50_EXTRA_MS = 5.0
MIN_DECODE_FRACTION = 0.60


def extract_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The scalars we keep from one vllm.benchmarks.serve result (per-request arrays are dropped)."""
    missing = [key for key in METRIC_KEYS.values() if key not in result]
    if missing:
        raise ValueError(f"benchmark result lacks {', '.join(missing)} (were the percentiles 50,99 asked for?)")
    return {name: float(result[key]) for name, key in METRIC_KEYS.items()}


def median_metrics(runs: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per metric, the median over repetitions (robust to one disturbed repetition on a shared machine)."""
    runs = list(runs)
    if not runs:
        raise ValueError("no runs to aggregate")
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


def ratio(ours: float, theirs: float) -> float:
    if theirs <= 0:
        raise ValueError(f"cannot divide by a non-positive baseline ({theirs})")
    return ours / theirs


@dataclass(frozen=True)
class Comparison:
    """`candidate` against `baseline` at one concurrency: medians of each and what the issue asks to report."""

    name: str  # "frontend" | "policy"
    candidate: str
    baseline: str
    concurrency: int
    repetitions: int
    candidate_metrics: dict[str, float]
    baseline_metrics: dict[str, float]
    request_ratio: float  # candidate / baseline, request/s (medians)
    output_ratio: float  # candidate / baseline, output tok/s (medians)
    paired_output_ratios: tuple[float, ...]  # per repetition, the two runs measured back to back
    ttft_p50_delta_ms: float  # candidate - baseline
    ttft_p99_delta_ms: float
    tpot_p50_delta_ms: float
    tpot_p99_delta_ms: float
    api_cpu_ratio: float | None = None  # candidate / baseline, API-process CPU ms per request (medians)

    @property
    def throughput_ratio(self) -> float:
        return min(self.request_ratio, self.output_ratio)

    @property
    def throughput_ok(self) -> bool:
        return self.throughput_ratio >= MIN_THROUGHPUT_RATIO

    @property
    def ttft_ok(self) -> bool:
        return self.ttft_p50_delta_ms <= MAX_TTFT_P50_EXTRA_MS

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(throughput_ratio=self.throughput_ratio, throughput_ok=self.throughput_ok, ttft_ok=self.ttft_ok)
        return out


def compare(
    name: str,
    candidate: str,
    baseline: str,
    concurrency: int,
    runs: Sequence[Mapping[str, Any]],
) -> Comparison:
    """`runs`: records with keys server, concurrency, rep, metrics. Pairs are matched on rep."""
    mine = {r["rep"]: r["metrics"] for r in runs if r["server"] == candidate and r["concurrency"] == concurrency}
    theirs = {r["rep"]: r["metrics"] for r in runs if r["server"] == baseline and r["concurrency"] == concurrency}
    if not mine or not theirs:
        raise ValueError(f"{name} c={concurrency}: no runs for {candidate if not mine else baseline}")
    a, b = median_metrics(mine.values()), median_metrics(theirs.values())
    paired = tuple(ratio(mine[k]["output_throughput"], theirs[k]["output_throughput"]) for k in sorted(mine.keys() & theirs.keys()))
    return Comparison(
        name=name,
        candidate=candidate,
        baseline=baseline,
        concurrency=concurrency,
        repetitions=min(len(mine), len(theirs)),
        candidate_metrics=a,
        baseline_metrics=b,
        request_ratio=ratio(a["request_throughput"], b["request_throughput"]),
        output_ratio=ratio(a["output_throughput"], b["output_throughput"]),
        paired_output_ratios=paired,
        ttft_p50_delta_ms=a["ttft_p50_ms"] - b["ttft_p50_ms"],
        ttft_p99_delta_ms=a["ttft_p99_ms"] - b["ttft_p99_ms"],
        tpot_p50_delta_ms=a["tpot_p50_ms"] - b["tpot_p50_ms"],
        tpot_p99_delta_ms=a["tpot_p99_ms"] - b["tpot_p99_ms"],
        api_cpu_ratio=ratio(a[CPU], b[CPU]) if CPU in a and CPU in b and b[CPU] > 0 else None,
    )


def summary_line(c: Comparison) -> str:
    """One line per comparison, as printed at the end of `python -m service bench`."""
    spread = ""
    if len(c.paired_output_ratios) > 1:
        spread = f" (pairs {min(c.paired_output_ratios):.3f}-{max(c.paired_output_ratios):.3f})"
    if c.name == "frontend":
        verdict = "OK" if c.throughput_ok and c.ttft_ok else "BELOW TARGET"
        target = f"target >= {MIN_THROUGHPUT_RATIO:.2f} and TTFT p50 <= +{MAX_TTFT_P50_EXTRA_MS:g} ms"
    else:
        verdict = "OK" if c.throughput_ratio >= MIN_THROUGHPUT_RATIO else "SLOWER"
        target = "target: never slower (>= 0.98 within noise)"
    return (
        f"{c.name} c={c.concurrency} {c.candidate}/{c.baseline}: req/s x{c.request_ratio:.3f}, "
        f"out tok/s x{c.output_ratio:.3f}{spread}, TTFT p50 {c.ttft_p50_delta_ms:+.1f} ms, "
        f"TPOT p50 {c.tpot_p50_delta_ms:+.2f} ms"
        + (f", API CPU/req x{c.api_cpu_ratio:.2f}" if c.api_cpu_ratio is not None else "")
        + f", n={c.repetitions} [{verdict}; {target}]"
    )


def headline(comparisons: Sequence[Comparison]) -> str:
    """The last line: the front-end throughput ratio (worst concurrency), for routine checks."""
    front = [c for c in comparisons if c.name == "frontend"]
    if not front:
        raise ValueError("no front-end comparison")
    worst = min(front, key=lambda c: c.throughput_ratio)
    return f"frontend throughput ratio ours/vllm: {worst.throughput_ratio:.3f} (worst of c={','.join(str(c.concurrency) for c in front)}: c={worst.concurrency})"


@dataclass(frozen=True)
class DecodeResult:
    """Batch-1 decode against the memory-bandwidth ceiling (bandwidth / weight bytes read per token)."""

    dtype: str
    tpot_p50_ms: float
    bandwidth_gbs: float  # 1e9 bytes/s, STREAM-style read with the engine's thread count
    bytes_per_token: int  # weights read per decoded token (embedding table excluded: one row is gathered)

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 / self.tpot_p50_ms

    @property
    def ceiling_tokens_per_s(self) -> float:
        return self.bandwidth_gbs * 1e9 / self.bytes_per_token

    @property
    def fraction(self) -> float:
        return self.tokens_per_s / self.ceiling_tokens_per_s

    @property
    def effective_gbs(self) -> float:
        return self.tokens_per_s * self.bytes_per_token / 1e9

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            tokens_per_s=self.tokens_per_s,
            ceiling_tokens_per_s=self.ceiling_tokens_per_s,
            fraction=self.fraction,
            effective_gbs=self.effective_gbs,
        )
        return out


def decode_line(d: DecodeResult) -> str:
    verdict = "OK" if d.fraction >= MIN_DECODE_FRACTION else "BELOW TARGET"
    return (
        f"decode {d.dtype} batch 1: {d.tokens_per_s:.2f} tok/s of a {d.ceiling_tokens_per_s:.2f} tok/s ceiling "
        f"({d.bandwidth_gbs:.1f} GB/s / {d.bytes_per_token / 1e9:.2f} GB per token) = {d.fraction:.0%} "
        f"[{verdict}; target >= {MIN_DECODE_FRACTION:.0%}]"
    )


def faster_dtype(results: Sequence[DecodeResult]) -> str:
    """The dtype with the higher batch-1 decode rate (the quantity the dtype default is chosen on)."""
    if not results:
        raise ValueError("no decode results")
    return max(results, key=lambda d: d.tokens_per_s).dtype
