"""table.md and the PNG plots of a bench run: the machine, then each part's section (bench/registry.py), every ratio with
its 95% interval and, against a target, its verdict; `--render` rewrites both from a finished run's results.json."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.registry import PARTS
from bench.stats import FRONTEND_TARGETS, POLICY_TARGETS, Comparison, DecodeResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def machine_line(results: dict[str, Any]) -> str:
    m, h = results["machine"], results["host"]
    isa = ", ".join(k for k, v in m["isa"].items() if v)
    client = m.get("client") or {}
    return (
        f"Machine: {m['cpu']} (family/model {m['family_model']}, {m['microarchitecture']}), {m['physical_cores']} cores, "
        f"{m['memory_gib']} GiB; ISA: {isa}; backend {m['backend']}; engine computes on CPU(s) {m['engine_cpus']}, "
        f"CPU(s) {m['reserved_cpus']} kept for the API server; torch {m['software']['torch']}, vLLM {m['software']['vllm']}. "
        + (client.get("note", "") + ". " if client else "")
        + f"Load average {h['loadavg_start'][0]:.1f} at start, {h['loadavg_end'][0]:.1f} at the end"
        + (
            f", up to {h['loadavg_1m_max_during_runs']:.1f} during the runs"
            if h.get("loadavg_1m_max_during_runs")
            else ""
        )
        + " (the cores are shared with other workers)."
    )


def markdown(
    results: dict[str, Any],
    comparisons: Sequence[Comparison] | None = None,
    decoded: Sequence[DecodeResult] | None = None,
) -> str:
    """table.md; the comparisons and decode rows are recomputed from `results` where not given."""
    comparisons = list(comparisons_of(results) if comparisons is None else comparisons)
    decoded = list(decoded_of(results) if decoded is None else decoded)
    parts = [
        f"Command: `{results['command']}` ({results['started']} to {results['finished']})",
        "",
        machine_line(results),
        "",
    ]
    for part in PARTS:
        if results.get(part.key):
            parts += part.section(results, comparisons, decoded)
    parts += ["```", *results["summary"], *([results["headline"]] if results.get("headline") else []), "```", ""]
    return "\n".join(parts)


def _ratio_axis(ax: Axes, comps: Sequence[Comparison], metric: str, label: str, bound: float | None) -> None:
    xs = list(range(len(comps)))
    es = [c.estimates[metric] for c in comps]
    ys = [e.value for e in es]
    lo = [e.value - (e.low if e.low is not None else e.value) for e in es]
    hi = [(e.high if e.high is not None else e.value) - e.value for e in es]
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=5)
    for x, c in zip(xs, comps):
        ax.annotate(
            f"{c.estimates[metric].value:.3g} {c.verdicts.get(metric, '')}",
            (x, ys[x]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    if bound is not None:
        ax.axhline(bound, color="red", linestyle="--", linewidth=1)
    ax.set_xticks(xs, [f"c={c.concurrency}" for c in comps])
    ax.set_ylabel(label)


def plots(
    out: Path, comparisons: Sequence[Comparison], decode: Sequence[DecodeResult], results: dict[str, Any]
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, title, targets in (
        ("frontend", "Front end: our service / vLLM's OpenAI server (95% intervals)", FRONTEND_TARGETS),
        ("policy", "Policy / vLLM defaults, both on vLLM's server (95% intervals)", POLICY_TARGETS),
    ):
        comps = [c for c in comparisons if c.name == name]
        if not comps:
            continue
        shown = [t for t in targets if all(t.metric in c.estimates for c in comps)]
        fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.8), squeeze=False)
        for ax, t in zip(axes[0], shown):
            _ratio_axis(ax, comps, t.metric, ("ratio " if t.kind == "ratio" else "difference ") + t.describe(), t.bound)
        fig.suptitle(title)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    peer = [c for c in comparisons if c.name.startswith("peer")]
    if peer:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for fmt in dict.fromkeys(c.name for c in peer):
            comps = sorted((c for c in peer if c.name == fmt), key=lambda c: c.concurrency)
            cs = [c.concurrency for c in comps]
            line = ax1.plot(
                cs, [c.candidate_metrics["output_throughput"] for c in comps], "o-", label=f"ours {fmt[5:]}"
            )
            ax1.plot(
                cs,
                [c.baseline_metrics["output_throughput"] for c in comps],
                "s--",
                color=line[0].get_color(),
                label=f"llama.cpp {fmt[5:]}",
            )
            es = [c.estimates["output_throughput"] for c in comps]
            ax2.errorbar(
                cs,
                [e.value for e in es],
                yerr=[[e.value - (e.low or e.value) for e in es], [(e.high or e.value) - e.value for e in es]],
                fmt="o-",
                capsize=4,
                label=fmt[5:],
            )
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency (closed loop)")
        ax1.set_ylabel("output tokens/s (median)")
        ax1.legend(fontsize=8)
        ax2.axhline(1.0, color="red", linestyle="--", linewidth=1)
        ax2.set_ylabel("output tok/s ratio ours / llama.cpp (95% CI)")
        ax2.legend(fontsize=8)
        fig.suptitle("Crossover: our service (vLLM engine) vs llama.cpp's server, same weights and threads")
        fig.tight_layout()
        path = out / "peer.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    rows = list(decode) + [DecodeResult(**d) for d in results.get("peer", {}).get("decode", [])]
    if rows:
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
        xs = range(len(rows))
        ax.bar(
            [x - 0.2 for x in xs],
            [d.ceiling_tokens_per_s for d in rows],
            0.4,
            label="ceiling (bandwidth / bytes per token)",
            color="#bbb",
        )
        ax.bar([x + 0.2 for x in xs], [d.tokens_per_s for d in rows], 0.4, label="measured (1 / TPOT p50)")
        for x, d in zip(xs, rows):
            ax.annotate(f"{d.fraction:.0%}", (x + 0.2, d.tokens_per_s), ha="center", va="bottom")
        ax.set_xticks(list(xs), [d.dtype for d in rows], fontsize=8, rotation=15)
        ax.set_ylabel("batch-1 decode tokens/s")
        ax.set_title("Decode against the memory-bandwidth ceiling")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "decode.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def comparisons_of(results: dict[str, Any]) -> list[Comparison]:
    """The comparisons of a finished run, recomputed from its runs."""
    return [c for part in PARTS if part.comparisons and results.get(part.key) for c in part.comparisons(results)]


def decoded_of(results: dict[str, Any]) -> list[DecodeResult]:
    return [d for part in PARTS if part.decoded and results.get(part.key) for d in part.decoded(results)]


def render(results_dir: Path) -> list[Comparison]:
    """Rewrite table.md and the plots of a finished run from its results.json (after a change of format)."""
    results = json.loads((results_dir / "results.json").read_text())
    comparisons = comparisons_of(results)
    (results_dir / "table.md").write_text(markdown(results, comparisons))
    plots(results_dir, comparisons, decoded_of(results), results)
    return comparisons
