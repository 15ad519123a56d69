"""The front end against vLLM's own OpenAI server on the same engine (same engine arguments and environment as the
service reports), and vLLM's server with the policy's arguments against vLLM's defaults: both through the A/B engine
of bench/context.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import servers as srv
from bench.context import Context, Side, ab_runs, ours_ready, profile_api, start
from bench.output import Output, log
from bench.stats import FRONTEND_TARGETS, POLICY_TARGETS, Comparison, DecodeResult, Target, compare, summary_line
from bench.tables import comparison_table
from harness import ServerProcess

# Two servers are up at once, each holding its KV cache: the policy's default (a share of the machine's memory) twice
# over got a worker OOM-killed on the shared 24 GiB machine. 0.5 GiB holds c=16 x 192 tokens of the demo model many
# times; vLLM's side gets the same size through the reported engine arguments.
FRONTEND_SETTINGS = {"SERVICE_KV_CACHE_GIB": "0.5"}


@dataclass(frozen=True)
class PolicyOptions:
    repetitions: int = 2


def run_frontend(ctx: Context, options: None) -> Output:
    """Ours against vLLM's own server with the engine arguments and environment ours reports."""
    opts = ctx.opts
    data: dict[str, Any] = {}
    given: dict[str, Any] = {}

    def make_vllm(path: Path) -> ServerProcess:
        assert ctx.reported is not None, "the service starts first in the first repetition"
        given["args"] = ctx.reported.engine_args
        return srv.vllm_same_engine(ctx.model, ctx.served, ctx.reported, path)

    ours = Side(
        "ours",
        lambda p: srv.ours(ctx.model, ctx.served, p, FRONTEND_SETTINGS),
        on_ready=ours_ready(ctx, lambda: given.get("args")),
    )
    vllm = Side("vllm", make_vllm)

    def after_last(live: dict[str, ServerProcess], runs: list[dict[str, Any]]) -> None:
        if not opts.profile:
            return
        comps = [compare("frontend", "ours", "vllm", c, runs) for c in opts.concurrencies]
        worst = min(comps, key=lambda c: c.throughput.value).concurrency
        log(f"py-spy on both API processes at c={worst} (the worst ratio), one extra uncounted run each")
        data["profile"] = {n: profile_api(p, worst, ctx) for n, p in live.items()}

    runs = ab_runs("frontend", (ours, vllm), ctx, opts.repetitions, 1000, after_last)
    data["runs"] = runs
    comparisons = tuple(compare("frontend", "ours", "vllm", c, runs, FRONTEND_TARGETS) for c in opts.concurrencies)
    return Output(data, comparisons, summary=tuple(summary_line(c) for c in comparisons))


def run_policy(ctx: Context, options: PolicyOptions) -> Output:
    """vLLM's server with the policy's arguments against vLLM's server with its defaults (same KV-cache size)."""
    opts = ctx.opts
    if ctx.reported is None:  # the front end was skipped: the service reports once
        server = start(srv.ours(ctx.model, ctx.served, ctx.logdir / "server-report.log", FRONTEND_SETTINGS), ctx)
        try:
            ours_ready(ctx, lambda: None)(server)
        finally:
            server.close()
    reported = ctx.reported
    assert reported is not None  # set by the front end or by the hook above
    kv = reported.engine_args.get("kv_cache_memory_bytes")
    with_policy = Side("vllm", lambda p: srv.vllm_same_engine(ctx.model, ctx.served, reported, p))
    defaults = Side("vllm-defaults", lambda p: srv.vllm_defaults(ctx.model, ctx.served, kv, p))
    runs = ab_runs("policy", (with_policy, defaults), ctx, options.repetitions, 2000)
    data = {"runs": runs, "defaults_argv": srv.vllm_defaults(ctx.model, ctx.served, kv, Path()).argv}
    comparisons = tuple(compare("policy", "vllm", "vllm-defaults", c, runs, POLICY_TARGETS) for c in opts.concurrencies)
    return Output(data, comparisons, summary=tuple(summary_line(c) for c in comparisons))


def comparisons(
    results: dict[str, Any], key: str, name: str, candidate: str, baseline: str, targets: Sequence[Target]
) -> list[Comparison]:
    """A finished run's comparisons of one part, recomputed from its runs (the report and --render)."""
    runs = results.get(key, {}).get("runs", [])
    return [compare(name, candidate, baseline, c, runs, targets) for c in dict.fromkeys(r["concurrency"] for r in runs)]


def frontend_comparisons(results: dict[str, Any]) -> list[Comparison]:
    return comparisons(results, "frontend", "frontend", "ours", "vllm", FRONTEND_TARGETS)


def policy_comparisons(results: dict[str, Any]) -> list[Comparison]:
    return comparisons(results, "policy_vs_defaults", "policy", "vllm", "vllm-defaults", POLICY_TARGETS)


def _workload(results: dict[str, Any], targets: str) -> str:
    o = results["options"]
    return (
        f"Workload: vllm.benchmarks.serve, random dataset, {o['input_len']} input / {o['output_len']} output tokens, "
        f"ignore_eos, temperature 0, closed loop at each concurrency; model `{results['model']['served_name']}`. "
        f"Each repetition restarts both servers (start order alternating) and runs {o['rounds']} pairs of runs per "
        "concurrency, A/B and B/A by turns. Cells: the two servers' medians, then the paired estimate (ratio: geometric "
        "mean of per-repetition ratios; ms: mean difference) with its 95% t-interval over repetitions; a target is met or "
        f"missed only when the whole interval is on one side of it, else unresolved. Targets: {targets}."
    )


def frontend_section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    targets = "; ".join(t.describe() for t in FRONTEND_TARGETS)
    mine = [c for c in comparisons if c.name == "frontend"]
    return [_workload(results, targets), "", comparison_table(mine), ""] if mine else []


def policy_section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    targets = "; ".join(t.describe() for t in POLICY_TARGETS)
    mine = [c for c in comparisons if c.name == "policy"]
    if not mine:
        return []
    return [
        "vLLM's own server with the policy's engine arguments against vLLM's defaults (same KV-cache size).",
        "",
        _workload(results, targets),
        "",
        comparison_table(mine),
        "",
    ]
