"""`python -m bench`: front end against vLLM's own server, policy against vLLM's defaults, batch-1 decode against the
bandwidth ceiling, and the llama.cpp peer (bench/peer.py). Every A/B comparison restarts both servers per repetition,
in alternating start order, and runs A/B/A/B on each pair of processes."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import servers as srv
from bench.load import ClientCpus, Workload, client_cpus, run_load
from bench.stats import (
    FRONTEND_TARGETS,
    POLICY_TARGETS,
    Comparison,
    DecodeResult,
    compare,
    decode_line,
    estimate,
    faster_dtype,
    headline,
    summary_line,
)
from harness import REPO, ServerProcess

RESULTS = REPO / "bench" / "results"
# Two servers are up at once, each holding its KV cache: the policy's default (a share of the machine's memory) twice
# over got a worker OOM-killed on the shared 24 GiB machine. 0.5 GiB holds c=16 x 192 tokens of the demo model many
# times; vLLM's side gets the same size through the reported engine arguments.
FRONTEND_SETTINGS = {"SERVICE_KV_CACHE_GIB": "0.5"}


@dataclass(frozen=True)
class BenchOptions:
    quick: bool = False
    concurrencies: tuple[int, ...] = (1, 4, 16)
    repetitions: int = 4  # restarts of both servers per comparison, start order alternating
    # Pairs of runs per concurrency on each pair of server processes, 1-3 s a run, A/B and B/A by turns: this
    # machine's speed drifts over seconds (one server's API CPU per request: autocorrelation 0.71 between
    # consecutive requests, 0.33 ten requests apart), and back-to-back runs of ~8 s differed by 6.8% (sd). With
    # short alternating runs (and the CPU counted to the ns) the c=4/16 intervals narrowed 2-6x (docs/bench.md).
    rounds: int = 16
    input_len: int = 128
    output_len: int = 64
    prompts: dict[int, int] = field(default_factory=lambda: {1: 4, 4: 12, 16: 32})  # per run: 2-3 waves of requests
    frontend: bool = True
    policy: bool = True  # policy vs vLLM defaults
    policy_repetitions: int = 2
    decode: bool = True  # decode vs the bandwidth ceiling
    profile: bool = True  # py-spy on both API processes and on the decode engine process, in extra (uncounted) runs
    preload: bool = True  # native decode with and without the preload the service decides (bench/preload.py)
    preload_repetitions: int = 3
    dtype: bool = True  # bf16 against fp32 decode, side by side (bench/dtype.py): the dtype policy's measurement
    dtype_repetitions: int = 3
    warm_start: bool = True  # start-to-ready, cold and warm compile cache, demo and bench model (bench/warm_start.py)
    quant: bool = True  # the quantized linear kernels per format (bench/quant_kernels.py)
    quant_formats: tuple[str, ...] = ("bf16", "w8a8", "w8a8-static", "w4a16")
    quant_repetitions: int = 3
    peer: bool = True  # llama.cpp's server, if `make bench-tools` built it
    peer_formats: tuple[str, ...] = ("bf16", "q8_0", "q4_0")
    peer_repetitions: int = 2
    peer_rounds: int = 1
    peer_input_len: int = 128
    peer_output_len: int = 32
    peer_prompts: dict[int, int] = field(default_factory=lambda: {1: 4, 4: 8, 16: 32})
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    decode_input_len: int = 32
    decode_output_len: int = 64
    decode_prompts: int = 3  # per round
    # Rounds of decode, each between two read-bandwidth probes: the host's bandwidth moved by x1.7 within minutes on
    # a shared guest (Zen 5, 2026-11-23), so a fraction is taken against the probes around its own round.
    decode_rounds: int = 6
    results_dir: Path = RESULTS

    @classmethod
    def quick_mode(cls, **kw: Any) -> BenchOptions:
        base: dict[str, Any] = dict(
            quick=True,
            concurrencies=(4,),
            repetitions=2,
            rounds=8,
            prompts={4: 12},
            policy=False,
            decode=False,
            profile=False,
            preload=False,
            dtype=False,
            warm_start=False,
            quant=False,
            peer=False,
        )
        base.update(kw)
        return cls(**base)

    def num_prompts(self, concurrency: int) -> int:
        return self.prompts.get(concurrency, 4 * concurrency)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Context:
    """What one bench run shares between its parts."""

    opts: BenchOptions
    out: Path
    model: str
    served: str
    reported: srv.Reported | None = None  # the service's latest GET /v1/hardware
    client: ClientCpus | None = None
    parity: list[dict[str, Any]] = field(default_factory=list)
    startup_s: dict[str, list[float]] = field(default_factory=dict)

    @property
    def logdir(self) -> Path:
        return self.out / "logs"

    def client_log(self, name: str) -> Path:
        return self.logdir / f"client-{name}.log"

    def load(
        self,
        w: Workload,
        server: ServerProcess,
        model: str | None = None,
        served: str | None = None,
        generated: Callable[[], float] | None = None,
        api_cpu: Callable[[], float] | None = None,
    ):
        return run_load(
            w,
            server.url,
            model or self.model,
            served or self.served,
            self.client_log(server.name),
            self.client.cpus if self.client else None,
            generated,
            api_cpu,
        )


@dataclass(frozen=True)
class Side:
    """One server of an A/B comparison: how to make a fresh process, and what to do once it is ready."""

    name: str
    make: Callable[[Path], ServerProcess]
    api_cpu: bool = True  # its own process is only the API server (the engine runs in child processes)
    on_ready: Callable[[ServerProcess], None] | None = None


def start(server: ServerProcess, ctx: Context, timeout: float = 900) -> ServerProcess:
    log(f"starting {server.name} on {server.url} (log {server.log_path.name})")
    server.start()
    try:
        took = server.wait_ready(timeout)
    except BaseException:
        server.kill_group()
        raise
    ctx.startup_s.setdefault(server.name, []).append(took)
    log(f"{server.name} ready after {took:.0f} s")
    return server


def ours_ready(ctx: Context, engine_args_given: Callable[[], dict[str, Any] | None]) -> Callable[[ServerProcess], None]:
    """Read the service's startup report over HTTP; check that vLLM's side got the same engine arguments."""

    def hook(server: ServerProcess) -> None:
        reported = srv.Reported.fetch(server.url)
        if ctx.reported is None:
            ctx.client = client_cpus(reported.allowed_cpus, reported.engine_cpus, reported.reserved_cpus)
            log(ctx.client.note)
        ctx.reported = reported
        given = engine_args_given()
        if given is not None:
            ctx.parity.append({"same": given == reported.engine_args, "service": reported.engine_args, "vllm": given})

    return hook


def round_order(started: Sequence[Side], rnd: int) -> Sequence[Side]:
    """A/B in even rounds, B/A in odd ones (A the first started): a drift of the machine's speed within a repetition
    then weighs on both sides alike instead of always on the one that runs second."""
    return started if rnd % 2 == 0 else started[::-1]


def ab_runs(
    name: str,
    sides: tuple[Side, Side],
    ctx: Context,
    repetitions: int,
    rounds: int,
    workload: Callable[[int, int, int], Workload],
    concurrencies: Sequence[int],
    after_last: Callable[[dict[str, ServerProcess], list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Per repetition: start both servers anew (the first of `sides` first in even repetitions, second in odd ones),
    warm both, then per concurrency `rounds` pairs of runs on the same workload, in the order `round_order` gives."""
    runs: list[dict[str, Any]] = []
    for rep in range(repetitions):
        order = sides if rep % 2 == 0 else sides[::-1]
        live: dict[str, ServerProcess] = {}
        try:
            for side in order:
                proc = start(side.make(ctx.logdir / f"server-{name}-{side.name}-rep{rep}.log"), ctx)
                live[side.name] = proc
                if side.on_ready:
                    side.on_ready(proc)
            for side in order:  # still alive once both are up (a shared machine's OOM killer picks big workers)
                if (
                    live[side.name].proc.poll() is not None
                    or httpx.get(live[side.name].url + live[side.name].ready_path, timeout=10).status_code != 200
                ):
                    raise RuntimeError(
                        f"{side.name} stopped serving while the other started:\n{live[side.name].log_tail()}"
                    )
            for side in order:  # warm: each concurrency once, discarded
                for c in concurrencies:
                    ctx.load(
                        Workload(c, max(2, 2 * c), ctx.opts.input_len, ctx.opts.output_len, seed=999), live[side.name]
                    )
            for c in concurrencies:
                for rnd in range(rounds):
                    w = workload(c, rep, rnd)
                    for position, side in enumerate(round_order(order, rnd)):
                        proc = live[side.name]
                        # CPU time of the API-server process only (not the engine core or workers): the front
                        # end's own cost, which neighbours on a shared machine slow down but do not inflate.
                        metrics, client = ctx.load(w, proc, api_cpu=proc.api_cpu_s if side.api_cpu else None)
                        runs.append(
                            {
                                "comparison": name,
                                "server": side.name,
                                "concurrency": c,
                                "rep": rep,
                                "round": rnd,
                                "position": position,
                                "started_first": order[0].name,
                                "workload": asdict(w),
                                "metrics": metrics,
                                "client": client,
                                "loadavg_1m": os.getloadavg()[0],
                            }
                        )
                        log(
                            f"{name} rep {rep + 1}/{repetitions} c={c} round {rnd + 1} {side.name}: "
                            f"{metrics['output_throughput']:.0f} tok/s, TTFT p50 {metrics['ttft_p50_ms']:.1f} ms, "
                            f"TPOT p50 {metrics['tpot_p50_ms']:.2f} ms"
                            + (f", API CPU {metrics['api_cpu_ms_per_request']:.1f} ms/req" if side.api_cpu else "")
                            + f"; client CPU {client['cpu_share']:.0%}, waited {client['run_queue_wait_share']:.0%}"
                            + (" STARVED" if client["starved"] else "")
                            + f"; load {os.getloadavg()[0]:.1f}"
                        )
            if after_last and rep == repetitions - 1:
                after_last(live, runs)
        finally:
            for proc in live.values():
                proc.close()
    return runs


def _profile(server: ServerProcess, c: int, ctx: Context) -> dict[str, Any]:
    """py-spy (sampling, non-blocking) on the server's API process during one extra, uncounted run."""
    from bench import profile

    out = ctx.logdir / f"py-spy-{server.name}-c{c}.folded"
    rec = profile.start_record(server.pid, out)
    if rec is None:
        return {"error": "py-spy not installed (pip install -e '.[bench]')"}
    time.sleep(1)
    cpu0, t0 = server.api_cpu_s(), time.monotonic()
    try:
        # As many requests as one server's measured runs of a repetition: the profile needs seconds of samples.
        prompts = ctx.opts.rounds * ctx.opts.num_prompts(c)
        w = Workload(c, prompts, ctx.opts.input_len, ctx.opts.output_len, seed=4242)
        metrics, _ = ctx.load(w, server)
    finally:
        profile.stop_record(rec)
    if not out.exists():
        return {"error": f"py-spy wrote nothing (exit {rec.returncode}); ptrace not permitted?"}
    summary = profile.summarize(out.read_text())
    summary.update(
        concurrency=c,
        folded=str(out),
        wall_s=time.monotonic() - t0,
        api_cpu_s=server.api_cpu_s() - cpu0,
        output_throughput=metrics["output_throughput"],
    )
    return summary


def frontend(ctx: Context, results: dict[str, Any]) -> list[Comparison]:
    """Ours against vLLM's own server with the engine arguments and environment ours reports."""
    opts = ctx.opts
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
        results["frontend"]["profile"] = {n: _profile(p, worst, ctx) for n, p in live.items()}

    results["frontend"] = {}
    runs = ab_runs(
        "frontend",
        (ours, vllm),
        ctx,
        opts.repetitions,
        opts.rounds,
        lambda c, rep, rnd: Workload(
            c, opts.num_prompts(c), opts.input_len, opts.output_len, seed=1000 * rep + 10 * rnd + c
        ),
        opts.concurrencies,
        after_last,
    )
    results["frontend"]["runs"] = runs
    return [compare("frontend", "ours", "vllm", c, runs, FRONTEND_TARGETS) for c in opts.concurrencies]


def policy(ctx: Context, results: dict[str, Any]) -> list[Comparison]:
    """vLLM's server with the policy's arguments against vLLM's server with its defaults (same KV-cache size)."""
    opts = ctx.opts
    if ctx.reported is None:  # the front end was skipped: the service reports once
        server = start(srv.ours(ctx.model, ctx.served, ctx.logdir / "server-report.log", FRONTEND_SETTINGS), ctx)
        try:
            ours_ready(ctx, lambda: None)(server)
        finally:
            server.close()
    reported = ctx.reported
    kv = reported.engine_args.get("kv_cache_memory_bytes")
    with_policy = Side("vllm", lambda p: srv.vllm_same_engine(ctx.model, ctx.served, reported, p))
    defaults = Side("vllm-defaults", lambda p: srv.vllm_defaults(ctx.model, ctx.served, kv, p))
    runs = ab_runs(
        "policy",
        (with_policy, defaults),
        ctx,
        opts.policy_repetitions,
        opts.rounds,
        lambda c, rep, rnd: Workload(
            c, opts.num_prompts(c), opts.input_len, opts.output_len, seed=2000 * rep + 10 * rnd + c
        ),
        opts.concurrencies,
    )
    results["policy_vs_defaults"] = {
        "runs": runs,
        "defaults_argv": srv.vllm_defaults(ctx.model, ctx.served, kv, Path()).argv,
    }
    return [compare("policy", "vllm", "vllm-defaults", c, runs, POLICY_TARGETS) for c in opts.concurrencies]


def decode(ctx: Context, results: dict[str, Any]) -> list[DecodeResult]:
    """Batch-1 decode of the bandwidth-bound model against the memory-bandwidth ceiling, per dtype."""
    from bench.bandwidth import read_bandwidth
    from bench.models import bytes_per_token, ensure_bench_model, parameters
    from service.policy.dtype import BYTES

    opts = ctx.opts
    log("building the bandwidth-bound model (random weights, once)")
    big = str(ensure_bench_model(cache_dir()))
    out: list[DecodeResult] = []
    results["decode"] = {"model": big, "parameters": parameters(), "runs": []}
    for dtype in _decode_dtypes(opts.dtypes):
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
            ctx.load(Workload(1, 1, opts.decode_input_len, 8, seed=7), server, big, "bench-llama")
            # The engine is idle while its CPUs are probed (an idle worker does not spin).
            probes = [read_bandwidth(engine_cpus)]
            rounds: list[dict[str, Any]] = []
            for i in range(opts.decode_rounds):
                w = Workload(1, opts.decode_prompts, opts.decode_input_len, opts.decode_output_len, seed=11 + i)
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
        results["decode"]["runs"].append(run | ({"profile": profiled} if profiled else {}))
        log(decode_line(d))
    results["decode"]["faster"] = faster_dtype(out)
    return out


def _decode_dtypes(dtypes: tuple[str, ...]) -> list[str]:
    """The dtypes whose decode ceiling is worth a compiled start here: not bf16 where the dtype policy's measurement
    for this CPU class says fp32 (bf16's compiled warm-up alone took over 10 minutes on AVX2; bench/dtype.py
    compares the two eager)."""
    from service.facts.hardware import read_hardware
    from service.facts.software import read_software
    from service.policy.backend import choose_backend
    from service.policy.backends import BACKENDS
    from service.policy.dtype import MEASUREMENTS, isa_class

    cpu = read_hardware().cpu
    cls = isa_class(cpu.isa, BACKENDS[choose_backend(cpu, read_software()).name or "avx2"])
    measured = MEASUREMENTS.get(cls)
    if measured is None or measured.high >= 1 or "bfloat16" not in dtypes:
        return list(dtypes)
    log(f"decode: bf16 left out on this {cls} CPU, where the service runs fp32 ({measured})")
    return [d for d in dtypes if d != "bfloat16"]


def native_preload(ctx: Context) -> dict[str, Any]:
    """Batch-1 decode of the bench model served natively with the preload the service decides (allocator + OpenMP
    runtime) and with vLLM's own (torch's GNU OpenMP, no allocator), restarted per repetition in alternating order."""
    from bench import preload
    from bench.models import ensure_bench_model

    log("native decode with and without the service's preload (bench model, restarted per repetition)")
    result = preload.measure(
        ensure_bench_model(cache_dir()),
        cache_dir(),
        ctx.logdir / "preload",
        ctx.opts.preload_repetitions,
        settings={"kv_cache_gib": "1"},
    )
    result["estimate"] = estimate("decode with/without preload", "ratio", result["ratios"]).fmt()
    log(preload_line(result))
    return result


def preload_line(result: dict[str, Any]) -> str:
    med = result["median_tok_s"]
    return (
        f"native decode with the service's preload {med['with']:.2f} tok/s, with vLLM's own {med['without']:.2f} "
        f"tok/s: with/without {result['estimate']}"
    )


def dtype_pair(ctx: Context) -> dict[str, Any]:
    """Batch-1 decode of the bench model in bf16 and fp32, served side by side, restarted per repetition."""
    from bench import dtype
    from bench.models import ensure_bench_model

    log("decode bf16 against fp32, side by side (bench model, restarted per repetition)")
    result = dtype.measure(
        ensure_bench_model(cache_dir()),
        cache_dir(),
        ctx.logdir / "dtype",
        ctx.opts.dtype_repetitions,
        settings={"kv_cache_gib": "1", "enforce_eager": "true"},
    )
    log(dtype_line(result))
    return result


def dtype_line(result: dict[str, Any]) -> str:
    med = result["median_tok_s"]
    return (
        f"decode side by side on {result['cpu']} ({result['isa_class']}): bf16 {med['bfloat16']:.2f} tok/s, "
        f"fp32 {med['float32']:.2f} tok/s: bf16/fp32 decode {result['estimate']}, prefill {result['prefill_estimate']}"
    )


def warm_starts(ctx: Context) -> list[dict[str, Any]]:
    """Start to /ready with torch.compile, cold (empty cache) then warm, for the demo and the bench model."""
    from bench import warm_start
    from bench.models import ensure_bench_model

    out = []
    for name, model in (("demo", None), ("bench", ensure_bench_model(cache_dir()))):
        log(f"start to ready, cold then warm compile cache: {name} model")
        result = warm_start.measure(model, ctx.logdir / f"warm-start-{name}", {"kv_cache_gib": "1"})
        out.append(result | {"name": name})
        log(warm_start_line(out[-1]))
    return out


def warm_start_line(result: dict[str, Any]) -> str:
    cold, warm = result["cold"], result["warm"]
    return (
        f"start to ready, {result['name']} model: cold {cold['ready_s']:.0f} s, warm {warm['ready_s']:.0f} s "
        f"(engine init {cold['engine_init_s']} s -> {warm['engine_init_s']} s; warm start "
        + ("loaded the compiled graph)" if warm["loaded_compiled"] and not warm["compiled_and_saved"] else "COMPILED)")
    )


def quant_kernels(ctx: Context) -> dict[str, Any]:
    """Each quantized format's linear kernel on the live backend, every candidate the policy can steer to, with
    decode, prefill, bandwidth ceiling, and quality against the bf16 source and against the checkpoint's exact
    dequantization (the kernel check, which a corrupted copy must fail)."""
    from bench.quant_kernels import measure

    opts = ctx.opts
    return measure(
        list(opts.quant_formats), opts.quant_repetitions, True, cache_dir(), ctx.logdir / "quant_kernels.json", log
    )


def quant_lines(report: dict[str, Any]) -> list[str]:
    from bench.quant_kernels import Candidate

    return [
        f"quantized {Candidate(r['format'], r['env']).label} ({r['kernel']}): "
        + (
            r["error"]
            if "error" in r
            else f"{r['decode']['median']:.1f} tok/s decode, {r['ceiling_fraction']:.0%} "
            f"of the ceiling, {r['prefill']['median']:.0f} tok/s prefill, kernel check "
            f"{'pass' if r['quality_passes'] else 'fail'}"
        )
        for r in report["rows"]
    ]


def _profile_decode(server: ServerProcess, w: Workload, ctx: Context, model: str, dtype: str) -> dict[str, Any]:
    """py-spy with native frames on the process that runs the forward pass, during one more (uncounted) batch-1
    decode run: the share of samples in the linear layers against attention, OpenMP, the scheduler and the rest."""
    from bench import profile

    pid = profile.compute_process(server.pid)
    if pid is None:
        return {"error": "no vLLM engine process found under the server"}
    out = ctx.logdir / f"py-spy-decode-{dtype}.folded"
    rec = profile.start_record(pid, out, rate=100, native=True)
    if rec is None:
        return {"error": "py-spy not installed (pip install -e '.[bench]')"}
    try:
        time.sleep(1)
        ctx.load(w, server, model, "bench-llama")
    finally:
        profile.stop_record(rec)
    if not out.exists():
        return {"error": f"py-spy wrote nothing (exit {rec.returncode}); ptrace not permitted?"}
    summary = profile.summarize(out.read_text(), areas=profile.WORKER_AREAS, threads_with=profile.COMPUTE_THREADS)
    log(
        f"decode {dtype}, where the engine process's samples go: "
        + ", ".join(f"{area} {share:.0%}" for area, share in summary["by_area"][:6])
    )
    return summary | {"pid": pid, "folded": str(out)}


def cache_dir() -> Path:
    """The service's model cache (configs/default.yaml < SERVICE_CACHE_DIR), read from its settings."""
    from service.settings import load_settings

    return load_settings(None).cache_dir


def run_bench(opts: BenchOptions, command: str | None = None) -> int:
    from bench import report as rep
    from service.demo_model import DEMO_NAME, ensure_demo_model

    started = dt.datetime.now()
    stamp = started.strftime("%Y%m%d-%H%M%S") + ("-quick" if opts.quick else "")
    out = opts.results_dir / stamp
    (out / "logs").mkdir(parents=True, exist_ok=True)
    command = command or "python -m bench" + (" --quick" if opts.quick else "")
    log(f"results in {out}")
    ctx = Context(opts, out, str(ensure_demo_model(cache_dir())), DEMO_NAME)
    results: dict[str, Any] = {
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "model": {"path": ctx.model, "served_name": ctx.served},
        "host": {"python": platform.python_version(), "kernel": platform.release(), "loadavg_start": os.getloadavg()},
        "note": "2 cores shared with other workers: absolute numbers are noisy; ratios are paired, with intervals",
    }
    comparisons: list[Comparison] = []
    decoded: list[DecodeResult] = []
    peer: dict[str, Any] | None = None
    parts: list[tuple[bool, Callable[[], Any]]] = [
        (opts.frontend, lambda: comparisons.extend(frontend(ctx, results))),
        (opts.policy, lambda: comparisons.extend(policy(ctx, results))),
        (opts.decode, lambda: decoded.extend(decode(ctx, results))),
        (opts.preload, lambda: results.update(preload=native_preload(ctx))),
        (opts.dtype, lambda: results.update(dtype=dtype_pair(ctx))),
        (opts.warm_start, lambda: results.update(warm_start=warm_starts(ctx))),
        (opts.quant, lambda: results.update(quant_kernels=quant_kernels(ctx))),
    ]
    for wanted, run in parts:
        if wanted:
            run()
            # Each part's raw results as soon as it ends: a later part that fails does not lose them.
            (out / "results.partial.json").write_text(json.dumps(results, indent=2, default=_json_default))
    if opts.peer:
        from bench import peer as peer_mod

        peer = peer_mod.run_peer(ctx, results)
        comparisons += peer.get("comparisons", []) if peer else []
    if ctx.reported is None:  # nothing started the service: its report once, for the machine facts
        server = start(srv.ours(ctx.model, ctx.served, ctx.logdir / "server-report.log"), ctx)
        try:
            ours_ready(ctx, lambda: None)(server)
        finally:
            server.close()

    results["machine"] = ctx.reported.machine() | {"client": asdict(ctx.client) if ctx.client else None}
    results["policy"] = {"engine_args": ctx.reported.engine_args, "env": ctx.reported.env}
    results["parity"] = ctx.parity
    results["startup_s"] = ctx.startup_s
    results["comparisons"] = [c.as_dict() for c in comparisons]
    results["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    results["host"]["loadavg_end"] = os.getloadavg()
    during = [r["loadavg_1m"] for r in _all_runs(results)]
    results["host"]["loadavg_1m_max_during_runs"] = max(during) if during else None
    results["summary"] = [summary_line(c) for c in comparisons] + [decode_line(d) for d in decoded]
    if peer:
        results["summary"] += peer.get("decode_lines", [])
    if opts.preload:
        results["summary"].append(preload_line(results["preload"]))
    if opts.dtype:
        results["summary"].append(dtype_line(results["dtype"]))
    if opts.warm_start:
        results["summary"] += [warm_start_line(w) for w in results["warm_start"]]
    if opts.quant:
        results["summary"] += quant_lines(results["quant_kernels"])
    front = [c for c in comparisons if c.name == "frontend"]
    results["headline"] = headline(front) if front else None
    (out / "results.json").write_text(json.dumps(results, indent=2, default=_json_default))
    (out / "table.md").write_text(rep.markdown(results, comparisons, decoded))
    plots = rep.plots(out, comparisons, decoded, results)
    latest = opts.results_dir / ("latest-quick" if opts.quick else "latest")
    with contextlib.suppress(FileNotFoundError):
        latest.unlink()
    latest.symlink_to(out.name)
    log(f"wrote {out / 'results.json'}, {out / 'table.md'}, {', '.join(p.name for p in plots)}")
    if ctx.client:
        print(ctx.client.note)
    for line in results["summary"]:
        print(line)
    if results["headline"]:
        print(results["headline"])
    return 0


def _all_runs(results: dict[str, Any]) -> list[dict[str, Any]]:
    runs = [r for part in ("frontend", "policy_vs_defaults") for r in results.get(part, {}).get("runs", [])]
    return runs + results.get("peer", {}).get("runs", [])


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    return str(obj)
