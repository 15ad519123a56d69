"""Batch-1 decode of the bandwidth-bound bench model against the memory-bandwidth ceiling, per dtype: the bandwidth
probed before and after every round, the fraction of the ceiling with a 95% interval over rounds."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import servers as srv
from bench.context import Context, cache_dir, start
from bench.load import Workload
from bench.output import Output, log
from bench.profile import step_line
from bench.stats import DECODE_TARGET, Comparison, DecodeResult, decode_line, faster_dtype
from bench.tables import decode_table
from harness import ServerProcess


@dataclass(frozen=True)
class DecodeOptions:
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    input_len: int = 32
    output_len: int = 64
    prompts: int = 3  # per round
    # Rounds of decode, each between two read-bandwidth probes: the host's bandwidth moved by x1.7 within minutes on
    # a shared guest (Zen 5, 2026-11-23), so a fraction is taken against the probes around its own round.
    rounds: int = 6


def run_decode(ctx: Context, options: DecodeOptions) -> Output:
    """Batch-1 decode of the bandwidth-bound model against the memory-bandwidth ceiling, per dtype."""
    from bench.bandwidth import read_bandwidth
    from harness.models import bytes_per_token, ensure_bench_model, parameters
    from service.policy.engine.dtype import BYTES

    opts = ctx.opts
    log("building the bandwidth-bound model (random weights, once)")
    big = str(ensure_bench_model(cache_dir()))
    out: list[DecodeResult] = []
    data: dict[str, Any] = {"model": big, "parameters": parameters(), "runs": []}
    for dtype in _decode_dtypes(options.dtypes):
        server = start(
            srv.ours(
                big,
                "bench-llama",
                ctx.logdir / f"server-decode-{dtype}.log",
                {"SERVICE_DTYPE": dtype, "SERVICE_KV_CACHE_GIB": "1"},
                name=f"ours-{dtype}",
            ),
            ctx,
        )
        profiled: dict[str, Any] | None = None
        nbytes = bytes_per_token(BYTES[dtype])
        try:
            engine_cpus = srv.Reported.fetch(server.url).engine_cpus
            ctx.load(Workload(1, 1, options.input_len, 8, seed=7), server, big, "bench-llama")
            # The engine is idle while its CPUs are probed (an idle worker does not spin).
            probes = [read_bandwidth(engine_cpus)]
            rounds: list[dict[str, Any]] = []
            for i in range(options.rounds):
                w = Workload(1, options.prompts, options.input_len, options.output_len, seed=11 + i)
                metrics, client = ctx.load(w, server, big, "bench-llama")
                probes.append(read_bandwidth(engine_cpus))
                gbs = (probes[-2]["gbs"] + probes[-1]["gbs"]) / 2
                fraction = DecodeResult(dtype, metrics["tpot_p50_ms"], gbs, nbytes).fraction
                rounds.append({"metrics": metrics, "client": client, "bandwidth_gbs": gbs, "fraction": fraction})
                log(
                    f"decode {dtype} round {i + 1}: TPOT p50 {metrics['tpot_p50_ms']:.2f} ms, {gbs:.1f} GB/s: {fraction:.1%}"
                )
            if opts.profile:
                profiled = _profile_decode(server, w, ctx, big, dtype)
        finally:
            server.close()
        d = DecodeResult(
            dtype,
            statistics.median(r["metrics"]["tpot_p50_ms"] for r in rounds),
            statistics.median(p["gbs"] for p in probes),
            nbytes,
            tuple(r["fraction"] for r in rounds),
        )
        out.append(d)
        run = {**d.as_dict(), "rounds": rounds, "bandwidth_probes": probes}
        data["runs"].append(run | ({"profile": profiled} if profiled else {}))
        log(decode_line(d))
    data["faster"] = faster_dtype(out)
    return Output(data, decoded=tuple(out), summary=tuple(decode_line(x) for x in out))


def _decode_dtypes(dtypes: tuple[str, ...]) -> list[str]:
    """The dtypes whose decode ceiling is worth a compiled start here: not bf16 where the dtype policy's measurement
    for this CPU class says fp32 (bf16's compiled warm-up alone took over 10 minutes on AVX2; bench/parts/dtype.py
    compares the two eager)."""
    from service.facts.hardware import read_hardware
    from service.facts.software import read_software
    from service.policy.engine.dtype import MEASUREMENTS, isa_class
    from service.policy.machine.backend import choose_backend
    from service.policy.machine.backends import BACKENDS

    cpu = read_hardware().cpu
    cls = isa_class(cpu.isa, BACKENDS[choose_backend(cpu, read_software()).name or "avx2"])
    measured = MEASUREMENTS.get(cls)
    if measured is None or measured.high >= 1 or "bfloat16" not in dtypes:
        return list(dtypes)
    log(f"decode: bf16 left out on this {cls} CPU, where the service runs fp32 ({measured})")
    return [d for d in dtypes if d != "bfloat16"]


def _profile_decode(server: ServerProcess, w: Workload, ctx: Context, model: str, dtype: str) -> dict[str, Any]:
    from bench import profile

    summary = profile.profile_decode(
        profile.compute_process(server.pid),
        lambda: ctx.load(w, server, model, "bench-llama"),
        ctx.logdir / f"py-spy-decode-{dtype}.folded",
    )
    if summary.get("samples"):
        log(f"decode {dtype}, where the engine process's samples go: {profile.step_line(summary)}")
    return summary


def decoded(results: dict[str, Any]) -> list[DecodeResult]:
    """A finished run's decode rows (the report and --render)."""
    return [
        DecodeResult(
            r["dtype"], r["tpot_p50_ms"], r["bandwidth_gbs"], r["bytes_per_token"], tuple(r.get("fractions", ()))
        )
        for r in results.get("decode", {}).get("runs", [])
    ]


def section(results: dict[str, Any], comparisons: list[Comparison], decoded: list[DecodeResult]) -> list[str]:
    model = results["decode"].get("model", "")
    parts = [
        f"Batch-1 decode, `{Path(model).name}` (random weights), against read bandwidth / weight bytes per token "
        f"(target >= {DECODE_TARGET.bound:.0%}; the mean of the rounds, each against the bandwidth probed just before "
        "and after it, with a 95% interval over rounds of one start):",
        "",
        decode_table(decoded),
        "",
    ]
    for run in results["decode"].get("runs", []):
        prof = run.get("profile") or {}
        if prof.get("samples"):
            parts += [
                f"Where a {run['dtype']} decode step goes (py-spy --native on the engine process, one extra run, "
                f"{prof['samples']} samples; ms at its TPOT p50): {step_line(prof, run.get('tpot_p50_ms'))}.",
                "",
            ]
    return parts
