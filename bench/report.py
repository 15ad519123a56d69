"""Markdown tables and PNG plots of a bench run: every ratio with its 95% interval and, against a target, its verdict."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.stats import (
    CPU,
    DECODE_TARGET,
    FRONTEND_TARGETS,
    PEER_ESTIMATES,
    POLICY_TARGETS,
    Comparison,
    DecodeResult,
    compare,
)

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


def _row(cells: Sequence[Any]) -> str:
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


def comparison_table(comparisons: Sequence[Comparison], columns=FRONT_COLUMNS, verdicts: bool = True) -> str:
    head = ["comparison", "c", "n", "servers", *(label for _, label, _ in columns)]
    if verdicts:
        head.append("verdict")
    lines = [_row(head), _row(["---"] * len(head))]
    for c in comparisons:
        starved = f" ({c.starved_runs} starved)" if c.starved_runs else ""
        row = [
            c.name,
            c.concurrency,
            f"{c.repetitions}{starved}",
            f"{c.candidate} / {c.baseline}",
            *(cell(c, m, d) for m, _, d in columns),
        ]
        if verdicts:
            row.append(c.overall)
        lines.append(_row(row))
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
    lines = [_row(head), _row(["---"] * len(head))]
    for d in decode:
        lines.append(
            _row(
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


def markdown(results: dict[str, Any], comparisons: Sequence[Comparison], decode: Sequence[DecodeResult]) -> str:
    o = results["options"]
    parts = [
        f"Command: `{results['command']}` ({results['started']} to {results['finished']})",
        "",
        machine_line(results),
        "",
    ]
    own = [c for c in comparisons if not c.name.startswith("peer")]
    if own:
        parts += [
            f"Workload: vllm.benchmarks.serve, random dataset, {o['input_len']} input / {o['output_len']} output tokens, "
            f"ignore_eos, temperature 0, closed loop at each concurrency; model `{results['model']['served_name']}`. "
            f"Each repetition restarts both servers (start order alternating) and runs {o['rounds']} pairs of runs per concurrency, A/B and B/A by turns. "
            "Cells: the two servers' medians, then the paired estimate (ratio: geometric mean of per-repetition ratios; "
            "ms: mean difference) with its 95% t-interval over repetitions; a target is met or missed only when the whole "
            "interval is on one side of it, else unresolved. Targets: "
            + "; ".join(t.describe() for t in FRONTEND_TARGETS)
            + " (front end); "
            + "; ".join(t.describe() for t in POLICY_TARGETS)
            + " (policy vs defaults).",
            "",
            comparison_table(own),
            "",
        ]
    peer = [c for c in comparisons if c.name.startswith("peer")]
    if peer:
        p = results.get("peer", {})
        parts += [
            f"Peer: llama.cpp's `llama-server` ({p.get('llama_server', '')}) on the same weights as GGUF, the same "
            "client (vllm.benchmarks.serve, random dataset, ignore_eos, temperature 0, closed loop; both servers "
            f"restarted per repetition), {o['peer_input_len']} input / {o['peer_output_len']} output tokens, "
            f"{p.get('threads')} compute thread(s) "
            f"on CPU(s) {p.get('engine_cpus')} for both, llama.cpp's parallel slots = concurrency; ratios ours/llama.cpp "
            "(output tok/s above 1: ours faster; latencies below 1: ours faster). "
            f"{_recounted(p)}",
            "",
            comparison_table(peer, PEER_COLUMNS, verdicts=False),
            "",
        ]
        if p.get("tokenization"):
            parts += [f"Tokenization check: {p['tokenization']}", ""]
        for failed in p.get("failed", []):
            parts += [
                f"Left out: {failed['comparison']} c={failed['concurrency']} repetition {failed['rep'] + 1}: "
                f"{failed['error']}",
                "",
            ]
    if decode or results.get("peer", {}).get("decode"):
        rows = list(decode) + [DecodeResult(**d) for d in results.get("peer", {}).get("decode", [])]
        model = results.get("decode", {}).get("model") or results.get("peer", {}).get("model", "")
        parts += [
            f"Batch-1 decode, `{Path(model).name}` (random weights), against read bandwidth / weight bytes per token "
            f"(target >= {DECODE_TARGET.bound:.0%}; the service's rows: the mean of its rounds, each against the "
            "bandwidth probed just before and after it, with a 95% interval over rounds of one start):",
            "",
            decode_table(rows),
            "",
        ]
        for run in results.get("decode", {}).get("runs", []):
            prof = run.get("profile") or {}
            if prof.get("samples"):
                parts += [
                    f"Where a {run['dtype']} decode step goes (py-spy --native on the engine process, one extra run, "
                    f"{prof['samples']} samples): "
                    + ", ".join(f"{area} {share:.0%}" for area, share in prof["by_area"])
                    + ".",
                    "",
                ]
    if results.get("preload"):
        p = results["preload"]
        used = next(
            (
                r["decisions"]["env.LD_PRELOAD"]["value"]
                for r in p["runs"]
                if r["variant"] == "with" and "env.LD_PRELOAD" in r["decisions"]
            ),
            None,
        )
        parts += [
            f"Native preload (`bench/preload.py`): batch-1 decode of `{Path(p['model']).name}` served by the service "
            f"with its own preload (`LD_PRELOAD={used}`) and with vLLM's (torch's GNU OpenMP, no allocator), "
            f"{len(p['ratios'])} repetitions restarting both (order alternating), "
            f"{p['requests_per_start']} decode rates of {p['max_tokens']} tokens per start: with "
            f"{p['median_tok_s']['with']:.2f} tok/s, without {p['median_tok_s']['without']:.2f} tok/s; "
            f"with/without {p['estimate']}.",
            "",
        ]
    if results.get("dtype"):
        d = results["dtype"]
        parts += [
            f"dtype (`bench/dtype.py`) on {d['cpu']} ({d['isa_class']}): batch-1 decode of `{Path(d['model']).name}` "
            f"served in bf16 and in fp32 side by side, {len(d['ratios'])} repetitions restarting both (order "
            f"alternating), {d['requests_per_start']} decode rates of {d['max_tokens']} tokens per start: bf16 "
            f"{d['median_tok_s']['bfloat16']:.2f} tok/s, fp32 {d['median_tok_s']['float32']:.2f} tok/s; "
            f"bf16/fp32 decode {d['estimate']}, prefill {d['prefill_estimate']}.",
            "",
        ]
    if results.get("warm_start"):
        head = ["model", "cold: start to ready", "warm", "vLLM engine init cold", "warm", "warm start"]
        lines = [_row(head), _row(["---"] * len(head))]
        for w in results["warm_start"]:
            cold, warm = w["cold"], w["warm"]
            how = (
                "loaded the compiled graph"
                if warm["loaded_compiled"] and not warm["compiled_and_saved"]
                else "compiled"
            )
            lines.append(
                _row(
                    [
                        w["name"],
                        f"{cold['ready_s']:.0f} s",
                        f"{warm['ready_s']:.0f} s",
                        f"{cold['engine_init_s']} s",
                        f"{warm['engine_init_s']} s",
                        how,
                    ]
                )
            )
        parts += [
            "Start to ready with torch.compile (`bench/warm_start.py`): a fresh cache directory, then the same one again.",
            "",
            *lines,
            "",
        ]
    if results.get("quant_kernels"):
        from bench.quant_kernels import heading, markdown_table

        parts += [heading(results["quant_kernels"]), "", markdown_table(results["quant_kernels"]), ""]
    parts += ["```", *results["summary"], *([results["headline"]] if results.get("headline") else []), "```", ""]
    return "\n".join(parts)


def _recounted(peer: dict[str, Any]) -> str:
    """How many runs' output-token counts came from the server's own counter instead of the client's."""
    runs = [r for r in peer.get("runs", []) if r["client"].get("output_tokens_counted_by_server") is not None]
    fixed = [
        r
        for r in runs
        if r["client"]["output_tokens_counted_by_client"] != r["client"]["output_tokens_counted_by_server"]
    ]
    if not fixed:
        return ""
    return (
        f"In {len(fixed)} of {len(runs)} llama.cpp runs vLLM's client counted fewer output tokens than llama-server "
        "generated (it skips the usage llama-server sends next to the last chunk's text and re-tokenizes the text); "
        "those runs' output tok/s and TPOT use llama-server's own count (its /metrics), which equalled what was asked."
    )


def _ratio_axis(ax, comps: Sequence[Comparison], metric: str, label: str, bound: float | None) -> None:
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
    out: list[Comparison] = []
    for part, name, cand, base, targets in (
        ("frontend", "frontend", "ours", "vllm", FRONTEND_TARGETS),
        ("policy_vs_defaults", "policy", "vllm", "vllm-defaults", POLICY_TARGETS),
    ):
        runs = results.get(part, {}).get("runs", [])
        for c in dict.fromkeys(r["concurrency"] for r in runs):
            out.append(compare(name, cand, base, c, runs, targets))
    peer_runs = results.get("peer", {}).get("runs", [])
    for fmt in dict.fromkeys(r["comparison"] for r in peer_runs):
        runs = [r for r in peer_runs if r["comparison"] == fmt]
        for c in dict.fromkeys(r["concurrency"] for r in runs):
            out.append(compare(fmt, "ours", "llama.cpp", c, runs, estimates=PEER_ESTIMATES))
    return out


def render(results_dir: Path) -> list[Comparison]:
    """Rewrite table.md and the plots of a finished run from its results.json (after a change of format)."""
    results = json.loads((results_dir / "results.json").read_text())
    comparisons = comparisons_of(results)
    decode = [
        DecodeResult(
            r["dtype"], r["tpot_p50_ms"], r["bandwidth_gbs"], r["bytes_per_token"], tuple(r.get("fractions", ()))
        )
        for r in results.get("decode", {}).get("runs", [])
    ]
    (results_dir / "table.md").write_text(markdown(results, comparisons, decode))
    plots(results_dir, comparisons, decode, results)
    return comparisons
