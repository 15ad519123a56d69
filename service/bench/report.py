"""Markdown table and PNG plots of a bench run."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.bench.stats import (
    MAX_TTFT_P50_EXTRA_MS,
    MIN_DECODE_FRACTION,
    MIN_THROUGHPUT_RATIO,
    Comparison,
    DecodeResult,
)


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def comparison_table(comparisons: Sequence[Comparison]) -> str:
    head = [
        "comparison", "c", "server", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "API CPU ms/req",
    ]
    lines = [_row(head), _row(["---"] * len(head))]
    for c in comparisons:
        for who, m in ((c.candidate, c.candidate_metrics), (c.baseline, c.baseline_metrics)):
            lines.append(
                _row([
                    c.name, c.concurrency, who, f"{m['request_throughput']:.2f}", f"{m['output_throughput']:.1f}",
                    f"{m['ttft_p50_ms']:.1f}", f"{m['ttft_p99_ms']:.1f}", f"{m['tpot_p50_ms']:.2f}", f"{m['tpot_p99_ms']:.2f}",
                    f"{m['api_cpu_ms_per_request']:.2f}" if "api_cpu_ms_per_request" in m else "",
                ])
            )
        verdict = "meets target" if c.throughput_ok and (c.ttft_ok or c.name != "frontend") else "BELOW TARGET"
        lines.append(
            _row([
                c.name, c.concurrency, f"**ratio {c.candidate}/{c.baseline}**", f"**{c.request_ratio:.3f}**",
                f"**{c.output_ratio:.3f}**", f"{c.ttft_p50_delta_ms:+.1f}", f"{c.ttft_p99_delta_ms:+.1f}",
                f"{c.tpot_p50_delta_ms:+.2f}", f"{c.tpot_p99_delta_ms:+.2f}",
                f"x{c.api_cpu_ratio:.2f} ({verdict})" if c.api_cpu_ratio is not None else f"({verdict})",
            ])
        )
    return "\n".join(lines)


def decode_table(decode: Sequence[DecodeResult]) -> str:
    head = ["dtype", "weights read / token", "read bandwidth", "ceiling tok/s", "measured tok/s", "fraction of ceiling", "effective GB/s"]
    lines = [_row(head), _row(["---"] * len(head))]
    for d in decode:
        lines.append(
            _row([
                d.dtype, f"{d.bytes_per_token / 1e9:.2f} GB", f"{d.bandwidth_gbs:.1f} GB/s", f"{d.ceiling_tokens_per_s:.2f}",
                f"{d.tokens_per_s:.2f}", f"**{d.fraction:.0%}**", f"{d.effective_gbs:.1f}",
            ])
        )
    return "\n".join(lines)


def markdown(results: dict[str, Any], comparisons: Sequence[Comparison], decode: Sequence[DecodeResult]) -> str:
    m = results["machine"]
    isa = ", ".join(k for k, v in m["isa"].items() if v)
    parts = [
        f"Command: `{results['command']}` ({results['started']} to {results['finished']})",
        "",
        f"Machine: {m['cpu']} (family/model {m['family_model']}, {m['microarchitecture']}"
        f"{', KVM guest' if m['hypervisor'] else ''}), {m['physical_cores']} cores, {m['memory_gib']} GiB; "
        f"ISA: {isa}; engine computes on CPU(s) {m['engine_cpus']}, CPU(s) {m['reserved_cpus']} kept for "
        f"the API server; torch {m['software']['torch']}, vLLM {m['software']['vllm']}. "
        f"Load average {m['loadavg_start'][0]:.1f} at start, {m['loadavg_end'][0]:.1f} at the end"
        + (f", up to {m['loadavg_1m_max_during_runs']:.1f} during the runs" if m.get("loadavg_1m_max_during_runs") else "")
        + " (the 2 cores are shared with other workers).",
        "",
        f"Workload: vllm.benchmarks.serve, random dataset, {results['options']['input_len']} input / "
        f"{results['options']['output_len']} output tokens, ignore_eos, temperature 0, closed loop at each concurrency; "
        f"medians of {results['options']['repetitions']} repetition(s); model `{results['model']['served_name']}`. "
        f"Targets: front-end throughput ratio >= {MIN_THROUGHPUT_RATIO}, TTFT p50 at most +{MAX_TTFT_P50_EXTRA_MS:g} ms; "
        "policy never slower than defaults.",
        "",
        comparison_table(comparisons),
    ]
    if decode:
        parts += [
            "",
            f"Batch-1 decode, `{Path(results['decode']['model']).name}` ({results['decode']['parameters'] / 1e9:.2f} B "
            f"parameters, random weights), against read bandwidth / weight bytes per token "
            f"(target >= {MIN_DECODE_FRACTION:.0%}):",
            "",
            decode_table(decode),
        ]
    parts += ["", "```", *results["summary"], results["headline"], "```", ""]
    return "\n".join(parts)


def plots(out: Path, comparisons: Sequence[Comparison], decode: Sequence[DecodeResult]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, title in (("frontend", "Front end: our service vs vLLM's OpenAI server"), ("policy", "Policy vs vLLM defaults (vLLM's server)")):
        comps = [c for c in comparisons if c.name == name]
        if not comps:
            continue
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        xs = range(len(comps))
        width = 0.38
        labels = [f"c={c.concurrency}" for c in comps]
        a = [c.candidate_metrics["output_throughput"] for c in comps]
        b = [c.baseline_metrics["output_throughput"] for c in comps]
        ax1.bar([x - width / 2 for x in xs], a, width, label=comps[0].candidate)
        ax1.bar([x + width / 2 for x in xs], b, width, label=comps[0].baseline)
        for x, c in zip(xs, comps):
            ax1.annotate(f"x{c.output_ratio:.3f}", (x, max(a[x], b[x])), ha="center", va="bottom", fontsize=9)
        ax1.set_xticks(list(xs), labels)
        ax1.set_ylabel("output tokens/s (median)")
        ax1.legend(loc="lower right")
        ta = [c.candidate_metrics["ttft_p50_ms"] for c in comps]
        tb = [c.baseline_metrics["ttft_p50_ms"] for c in comps]
        ax2.bar([x - width / 2 for x in xs], ta, width, label=comps[0].candidate)
        ax2.bar([x + width / 2 for x in xs], tb, width, label=comps[0].baseline)
        for x, c in zip(xs, comps):
            ax2.annotate(f"{c.ttft_p50_delta_ms:+.1f} ms", (x, max(ta[x], tb[x])), ha="center", va="bottom", fontsize=9)
        ax2.set_xticks(list(xs), labels)
        ax2.set_ylabel("TTFT p50 (ms)")
        fig.suptitle(title)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    if decode:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = range(len(decode))
        ax.bar([x - 0.2 for x in xs], [d.ceiling_tokens_per_s for d in decode], 0.4, label="ceiling (bandwidth / bytes per token)", color="#bbb")
        ax.bar([x + 0.2 for x in xs], [d.tokens_per_s for d in decode], 0.4, label="measured (1 / TPOT p50)")
        for x, d in zip(xs, decode):
            ax.annotate(f"{d.fraction:.0%}", (x + 0.2, d.tokens_per_s), ha="center", va="bottom")
        ax.set_xticks(list(xs), [d.dtype for d in decode])
        ax.set_ylabel("batch-1 decode tokens/s")
        ax.set_title("Decode against the memory-bandwidth ceiling")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "decode.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def render(results_dir: Path) -> tuple[list[Comparison], list[DecodeResult]]:
    """Rewrite table.md and the plots of a finished run from its results.json (after a change of format)."""
    import json

    from service.bench.stats import compare

    results = json.loads((results_dir / "results.json").read_text())
    comparisons: list[Comparison] = []
    for part, name in (("frontend", "frontend"), ("policy_vs_defaults", "policy")):
        runs = results.get(part, {}).get("runs", [])
        servers = list(dict.fromkeys(r["server"] for r in runs))
        for c in dict.fromkeys(r["concurrency"] for r in runs):
            candidate = "ours" if name == "frontend" else "vllm"
            baseline = next(s for s in servers if s != candidate)
            comparisons.append(compare(name, candidate, baseline, c, runs))
    decode = [
        DecodeResult(r["dtype"], r["tpot_p50_ms"], r["bandwidth_gbs"], r["bytes_per_token"])
        for r in results.get("decode", {}).get("runs", [])
    ]
    (results_dir / "table.md").write_text(markdown(results, comparisons, decode))
    plots(results_dir, comparisons, decode)
    return comparisons, decode
