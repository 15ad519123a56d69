"""Pure arithmetic on benchmark results: the metrics kept, paired ratios or differences per repetition, their 95%
confidence intervals, and verdicts against targets (met / missed / unresolved)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

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
    "total_output_tokens": "total_output_tokens",
}
CPU = "api_cpu_ms_per_request"  # added by the runner: CPU time of the API-server process per request

Kind = Literal["ratio", "delta"]  # candidate / baseline (geometric, on log-ratios) or candidate - baseline
Sense = Literal[">=", "<="]


@dataclass(frozen=True)
class Target:
    metric: str
    kind: Kind
    sense: Sense
    bound: float

    def describe(self) -> str:
        unit = {"ttft_p50_ms": " ms", "tpot_p50_ms": " ms"}.get(self.metric, "")
        what = f"x{self.bound:g}" if self.kind == "ratio" else f"{self.bound:+g}{unit}"
        return f"{LABELS.get(self.metric, self.metric)} {self.sense} {what}"


LABELS = {
    "output_throughput": "out tok/s",
    "request_throughput": "req/s",
    "ttft_p50_ms": "TTFT p50",
    "ttft_p99_ms": "TTFT p99",
    "tpot_p50_ms": "TPOT p50",
    CPU: "API CPU/req",
}

# Issue 11's targets for the front end (ours against vLLM's own server on the same engine), at every concurrency.
FRONTEND_TARGETS = (
    Target("output_throughput", "ratio", ">=", 0.98),
    Target("ttft_p50_ms", "delta", "<=", 5.0),
    Target("tpot_p50_ms", "delta", "<=", 0.2),
    Target(CPU, "ratio", "<=", 1.0),
)
POLICY_TARGETS = (Target("output_throughput", "ratio", ">=", 0.98),)
# The peer (ours against llama.cpp's server): no target, every figure a ratio ours/llama.cpp.
PEER_ESTIMATES: tuple[tuple[str, Kind], ...] = (
    ("output_throughput", "ratio"),
    ("ttft_p50_ms", "ratio"),
    ("ttft_p99_ms", "ratio"),
    ("tpot_p50_ms", "ratio"),
)
# Issue 11: batch-1 decode at >= 80% of the read-bandwidth ceiling; met or missed only by the whole interval.
DECODE_TARGET = Target("fraction", "ratio", ">=", 0.80)

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom; past 30 the normal's 1.96 is within 2%.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("a t-interval needs at least two samples")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def extract_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The scalars we keep from one vllm.benchmarks.serve result (per-request arrays are dropped)."""
    missing = [key for key in METRIC_KEYS.values() if key not in result]
    if missing:
        raise ValueError(f"benchmark result lacks {', '.join(missing)} (were the percentiles 50,99 asked for?)")
    return {name: float(result[key]) for name, key in METRIC_KEYS.items()}


def with_asked_output_lengths(result: Mapping[str, Any], output_len: int) -> dict[str, Any]:
    """The client's result recomputed with every completed request at `output_len` output tokens.

    For a server whose token counts vLLM's client does not read: llama-server sends `usage` in the last chunk, next
    to that chunk's text, and the client takes usage only from a chunk without choices; it then re-tokenizes the
    text it received, which for random weights is a fraction of the tokens (54 of 128 in one run), and divides the
    same time by that count. The caller confirms first, with the server's own counter, that it generated exactly
    `output_len` per request. Output throughput and TPOT change; TTFT and ITL (per chunk) do not."""
    tpots = [sum(itl) / (output_len - 1) for ttft, itl in zip(result["ttfts"], result["itls"]) if ttft]
    total = output_len * int(result["completed"])
    fixed = dict(result)
    fixed["total_output_tokens"] = total
    fixed["output_throughput"] = total / result["duration"]
    for p in (50, 99):
        # numpy's percentile, as vLLM's client computes its own
        fixed[f"p{p}_tpot_ms"] = float(np.percentile(tpots, p)) * 1000 if tpots else 0.0
    return fixed


def median_metrics(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per metric, the median over runs (the table's absolute figures)."""
    if not runs:
        raise ValueError("no runs to aggregate")
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


def ratio(ours: float, theirs: float) -> float:
    if theirs <= 0:
        raise ValueError(f"cannot divide by a non-positive baseline ({theirs})")
    return ours / theirs


@dataclass(frozen=True)
class Estimate:
    """A paired estimate over repetitions with its 95% t-interval (None with fewer than two repetitions)."""

    metric: str
    kind: Kind
    value: float
    low: float | None
    high: float | None
    samples: tuple[float, ...]  # one per repetition: its paired ratio (or difference)

    @property
    def n(self) -> int:
        return len(self.samples)

    def fmt(self) -> str:
        def one(x: float) -> str:
            return f"{x:.3f}" if self.kind == "ratio" else f"{x:+.2f}"

        head = ("x" if self.kind == "ratio" else "") + one(self.value)
        if self.low is None or self.high is None:
            return head + " [n=1, no interval]"
        return f"{head} [{one(self.low)}, {one(self.high)}]"


def estimate(metric: str, kind: Kind, samples: Sequence[float]) -> Estimate:
    """Ratios are averaged as logs (a ratio and its inverse weigh the same), differences as they are."""
    xs = [math.log(s) for s in samples] if kind == "ratio" else list(samples)
    back = math.exp if kind == "ratio" else (lambda x: x)
    mean = statistics.fmean(xs)
    low = high = None
    if len(xs) >= 2:
        half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
        low, high = back(mean - half), back(mean + half)
    return Estimate(metric, kind, back(mean), low, high, tuple(samples))


def verdict(e: Estimate, t: Target) -> str:
    """ "met" / "missed" only when the whole interval is on one side of the target; else "unresolved"."""
    if e.low is None or e.high is None:
        return "unresolved"
    if t.sense == ">=":
        return "met" if e.low >= t.bound else "missed" if e.high < t.bound else "unresolved"
    return "met" if e.high <= t.bound else "missed" if e.low > t.bound else "unresolved"


def paired_samples(
    runs: Sequence[Mapping[str, Any]], candidate: str, baseline: str, metric: str, kind: Kind
) -> list[float]:
    """One sample per repetition: the runs of a repetition (A/B/A/B on one pair of server processes) paired in order,
    their ratios' geometric mean (or their differences' mean). The repetition is the unit: restarts vary more than
    runs on the same processes do."""
    out = []
    for rep in sorted({r["rep"] for r in runs}):
        a = [r["metrics"][metric] for r in runs if r["rep"] == rep and r["server"] == candidate]
        b = [r["metrics"][metric] for r in runs if r["rep"] == rep and r["server"] == baseline]
        pairs = list(zip(a, b))
        if not pairs:
            continue
        if kind == "ratio":
            out.append(math.exp(statistics.fmean(math.log(ratio(x, y)) for x, y in pairs)))
        else:
            out.append(statistics.fmean(x - y for x, y in pairs))
    return out


@dataclass(frozen=True)
class Comparison:
    """`candidate` against `baseline` at one concurrency: medians of each, paired estimates, verdicts."""

    name: str  # "frontend" | "policy" | "peer-<format>"
    candidate: str
    baseline: str
    concurrency: int
    repetitions: int
    candidate_metrics: dict[str, float]
    baseline_metrics: dict[str, float]
    estimates: dict[str, Estimate]
    verdicts: dict[str, str] = field(default_factory=dict)  # metric -> met | missed | unresolved
    targets: tuple[Target, ...] = ()
    starved_runs: int = 0  # runs whose load generator waited for a CPU (its timings include that wait)

    @property
    def throughput(self) -> Estimate:
        return self.estimates["output_throughput"]

    @property
    def overall(self) -> str:
        """missed if any target is missed, met if all are met, else unresolved."""
        vs = list(self.verdicts.values())
        if not vs:
            return "-"
        return "missed" if "missed" in vs else "met" if all(v == "met" for v in vs) else "unresolved"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["overall"] = self.overall
        return out


def compare(
    name: str,
    candidate: str,
    baseline: str,
    concurrency: int,
    runs: Sequence[Mapping[str, Any]],
    targets: Sequence[Target] = (),
    estimates: Sequence[tuple[str, Kind]] = (),
) -> Comparison:
    """`runs`: records with keys server, concurrency, rep, metrics (and client.starved)."""
    runs = [r for r in runs if r["concurrency"] == concurrency]
    mine = [r["metrics"] for r in runs if r["server"] == candidate]
    theirs = [r["metrics"] for r in runs if r["server"] == baseline]
    if not mine or not theirs:
        raise ValueError(f"{name} c={concurrency}: no runs for {candidate if not mine else baseline}")
    wanted = [(t.metric, t.kind) for t in targets] + [e for e in estimates if e[0] not in {t.metric for t in targets}]
    if "output_throughput" not in {m for m, _ in wanted}:
        wanted.insert(0, ("output_throughput", "ratio"))
    ests = {}
    for metric, kind in wanted:
        if metric not in mine[0] or metric not in theirs[0]:
            continue
        samples = paired_samples(runs, candidate, baseline, metric, kind)
        if samples:
            ests[metric] = estimate(metric, kind, samples)
    verdicts = {t.metric: verdict(ests[t.metric], t) for t in targets if t.metric in ests}
    return Comparison(
        name=name,
        candidate=candidate,
        baseline=baseline,
        concurrency=concurrency,
        repetitions=len({r["rep"] for r in runs}),
        candidate_metrics=median_metrics(mine),
        baseline_metrics=median_metrics(theirs),
        estimates=ests,
        verdicts=verdicts,
        targets=tuple(targets),
        starved_runs=sum(1 for r in runs if r.get("client", {}).get("starved")),
    )


def summary_line(c: Comparison) -> str:
    """One line per comparison: each estimate with its interval and, against a target, its verdict."""
    parts = []
    for metric, e in c.estimates.items():
        t = next((t for t in c.targets if t.metric == metric), None)
        parts.append(
            f"{LABELS.get(metric, metric)} {e.fmt()}" + (f" {c.verdicts[metric]} ({t.describe()})" if t else "")
        )
    starved = f"; {c.starved_runs} run(s) with a starved load generator" if c.starved_runs else ""
    return f"{c.name} c={c.concurrency} {c.candidate}/{c.baseline} (n={c.repetitions}{starved}): " + ", ".join(parts)


def headline(comparisons: Sequence[Comparison]) -> str:
    """The last line: the front-end throughput ratio (worst concurrency) with its interval, for routine checks."""
    front = [c for c in comparisons if c.name == "frontend"]
    if not front:
        raise ValueError("no front-end comparison")
    worst = min(front, key=lambda c: c.throughput.value)
    cs = ",".join(str(c.concurrency) for c in front)
    return (
        f"frontend throughput ratio ours/vllm: {worst.throughput.value:.3f} "
        f"{worst.throughput.fmt().split(' ', 1)[1]} {worst.verdicts.get('output_throughput', '')} "
        f"(worst of c={cs}: c={worst.concurrency})"
    )


@dataclass(frozen=True)
class DecodeResult:
    """Batch-1 decode against the memory-bandwidth ceiling (bandwidth / weight bytes read per token)."""

    dtype: str  # or the format, e.g. "llama.cpp Q8_0"
    tpot_p50_ms: float
    bandwidth_gbs: float  # 1e9 bytes/s, STREAM-style read with the engine's thread count
    bytes_per_token: int  # weights read per decoded token (embedding table excluded: one row is gathered)
    # Per round (decode_rounds): its decode rate over the ceiling of the bandwidth probes just before and after it.
    fractions: tuple[float, ...] = ()

    @property
    def fraction_estimate(self) -> Estimate | None:
        return estimate("fraction of the ceiling", "ratio", self.fractions) if self.fractions else None

    @property
    def target_verdict(self) -> str:
        """Against DECODE_TARGET by the rounds' interval; "unresolved" without one (a single probe)."""
        e = self.fraction_estimate
        return verdict(e, DECODE_TARGET) if e else "unresolved"

    def fraction_text(self) -> str:
        e = self.fraction_estimate
        if e is None or e.low is None or e.high is None:
            return f"{self.fraction:.0%}"
        return f"{e.value:.1%} [{e.low:.1%}, {e.high:.1%}]"

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
        e = self.fraction_estimate
        out.update(
            fraction_interval=[e.low, e.high] if e else None,
            verdict=self.target_verdict,
            tokens_per_s=self.tokens_per_s,
            ceiling_tokens_per_s=self.ceiling_tokens_per_s,
            fraction=self.fraction,
            effective_gbs=self.effective_gbs,
        )
        return out


def decode_line(d: DecodeResult) -> str:
    rounds = f" over {len(d.fractions)} rounds" if d.fractions else ""
    return (
        f"decode {d.dtype} batch 1: {d.tokens_per_s:.2f} tok/s of a {d.ceiling_tokens_per_s:.2f} tok/s ceiling "
        f"({d.bandwidth_gbs:.1f} GB/s / {d.bytes_per_token / 1e9:.2f} GB per token) = {d.fraction_text()}{rounds}: "
        f"{d.target_verdict} (target >= {DECODE_TARGET.bound:.0%})"
    )


def faster_dtype(results: Sequence[DecodeResult]) -> str:
    """The dtype with the higher batch-1 decode rate (the quantity the dtype default is chosen on)."""
    if not results:
        raise ValueError("no decode results")
    return max(results, key=lambda d: d.tokens_per_s).dtype
