"""Markdown of bench results: a row, a comparison cell ("a / b: estimate [low, high] verdict"), the comparison and
decode tables the parts' report sections are made of."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.stats import CPU, Comparison, DecodeResult

FRONT_COLUMNS = (
    ("output_throughput", "out tok/s", 1),
    ("ttft_p50_ms", "TTFT p50 ms", 1),
    ("tpot_p50_ms", "TPOT p50 ms", 2),
    (CPU, "API CPU ms/req", 1),
)
PEER_COLUMNS = (
    ("output_throughput", "out tok/s", 1),
    ("ttft_p50_ms", "TTFT p50 ms", 0),
    ("ttft_p99_ms", "TTFT p99 ms", 0),
    ("tpot_p50_ms", "TPOT p50 ms", 1),
)


def row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def cell(c: Comparison, metric: str, digits: int) -> str:
    """ "a / b: estimate [low, high] verdict" (a, b: the two servers' medians)."""
    a, b = c.candidate_metrics.get(metric), c.baseline_metrics.get(metric)
    if a is None or b is None:
        return ""
    e = c.estimates.get(metric)
    head = f"{a:.{digits}f} / {b:.{digits}f}"
    if e is None:
        return head
    verdict = c.verdicts.get(metric)
    return f"{head}: **{e.fmt()}**" + (f" {verdict}" if verdict else "")


def comparison_table(
    comparisons: Sequence[Comparison], columns: Sequence[tuple[str, str, int]] = FRONT_COLUMNS, verdicts: bool = True
) -> str:
    head = ["comparison", "c", "n", "servers", *(label for _, label, _ in columns)]
    if verdicts:
        head.append("verdict")
    lines = [row(head), row(["---"] * len(head))]
    for c in comparisons:
        starved = f" ({c.starved_runs} starved)" if c.starved_runs else ""
        cells = [
            c.name,
            c.concurrency,
            f"{c.repetitions}{starved}",
            f"{c.candidate} / {c.baseline}",
            *(cell(c, m, d) for m, _, d in columns),
        ]
        if verdicts:
            cells.append(c.overall)
        lines.append(row(cells))
    return "\n".join(lines)


def decode_table(decode: Sequence[DecodeResult]) -> str:
    head = [
        "dtype / format",
        "weights read / token",
        "read bandwidth",
        "ceiling tok/s",
        "measured tok/s",
        "fraction of ceiling",
        "verdict",
        "effective GB/s",
    ]
    lines = [row(head), row(["---"] * len(head))]
    for d in decode:
        lines.append(
            row(
                [
                    d.dtype,
                    f"{d.bytes_per_token / 1e9:.2f} GB",
                    f"{d.bandwidth_gbs:.1f} GB/s",
                    f"{d.ceiling_tokens_per_s:.2f}",
                    f"{d.tokens_per_s:.2f}",
                    f"**{d.fraction_text()}**",
                    d.target_verdict if d.fractions else "",
                    f"{d.effective_gbs:.1f}",
                ]
            )
        )
    return "\n".join(lines)
