"""`python -m service bench`: the three comparisons of issue 5, run one server at a time on a shared CPU."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from unittest import mock

from service.bench import servers as srv
from service.bench.load import Workload, run_load
from service.bench.stats import Comparison, DecodeResult, compare, decode_line, faster_dtype, headline, summary_line

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@dataclass(frozen=True)
class BenchOptions:
    quick: bool = False
    concurrencies: tuple[int, ...] = (1, 4, 16)
    repetitions: int = 3
    input_len: int = 128
    output_len: int = 64
    prompts: dict[int, int] = field(default_factory=lambda: {1: 32, 4: 96, 16: 256})  # ~10 s a run
    policy: bool = True  # part 2: policy vs vLLM defaults
    decode: bool = True  # part 3: decode vs the bandwidth ceiling
    profile: bool = True  # py-spy on our front end, in an extra (uncounted) run
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    decode_input_len: int = 32
    decode_output_len: int = 64
    decode_prompts: int = 3
    results_dir: Path = RESULTS

    @classmethod
    def quick_mode(cls, **kw: Any) -> "BenchOptions":
        base = dict(quick=True, concurrencies=(4,), repetitions=1, prompts={4: 96}, policy=False, decode=False, profile=False)
        base.update(kw)
        return cls(**base)

    def num_prompts(self, concurrency: int) -> int:
        return self.prompts.get(concurrency, 4 * concurrency)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _only_service_env(settings_env: dict[str, str]) -> Iterator[None]:
    """Settings read from exactly the SERVICE_* variables a server gets, nothing inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    env.update(settings_env)
    with mock.patch.dict(os.environ, env, clear=True):
        yield


def policy_report(model: str, settings_env: dict[str, str]):
    from service.settings import load_settings
    from service.startup import build_report

    with _only_service_env(settings_env):
        settings = load_settings(None)
        report = build_report(settings, model=model, environ=srv.base_env())
    if not report.ok:
        raise RuntimeError("the policy refuses this machine/model: " + "; ".join(report.errors))
    return settings, report


def machine(report) -> dict[str, Any]:
    hw = report.to_dict()["hardware"]
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {
        "cpu": hw["model_name"],
        "family_model": f"{hw['family']}/{hw['model']}",
        "microarchitecture": hw["microarchitecture"],
        "hypervisor": "hypervisor" in cpuinfo.split("\nflags", 1)[-1].split("\n", 1)[0],
        "isa": hw["isa"],
        "physical_cores": hw["physical_cores"],
        "logical_cpus": hw["logical_cpus"],
        "numa_nodes": hw["numa_nodes"],
        "memory_gib": round(hw["memory_limit_bytes"] / 1024**3, 1) if hw["memory_limit_bytes"] else None,
        "engine_cpus": [list(r) for r in report.plan.threads.ranks] if report.plan.threads else None,
        "reserved_cpus": list(report.plan.threads.reserved) if report.plan.threads else None,
        "software": report.to_dict()["software"],
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_start": os.getloadavg(),
    }


def _warm(server: srv.Server, opts: BenchOptions, model: str, served: str, logdir: Path) -> None:
    """One warm-up round per server (each concurrency once, results discarded)."""
    for c in opts.concurrencies:
        w = Workload(c, max(2, 2 * c), opts.input_len, opts.output_len, seed=999)
        run_load(w, server.url, model, served, logdir / f"client-{server.name}.log")


def _paired_runs(
    name: str,
    pair: tuple[srv.Server, srv.Server],
    opts: BenchOptions,
    model: str,
    served: str,
    logdir: Path,
) -> list[dict[str, Any]]:
    """Repetitions x concurrencies; each (rep, concurrency) runs both servers back to back on the same
    workload (same seed), the one that goes first alternating."""
    runs: list[dict[str, Any]] = []
    step = 0
    for rep in range(opts.repetitions):
        for c in opts.concurrencies:
            order = pair if step % 2 == 0 else pair[::-1]
            step += 1
            w = Workload(c, opts.num_prompts(c), opts.input_len, opts.output_len, seed=1000 * rep + c)
            for position, server in enumerate(order):
                cpu0 = server.api_cpu_s()
                metrics = run_load(w, server.url, model, served, logdir / f"client-{server.name}.log")
                # CPU time of the API-server process only (not the engine core or workers): the front end's
                # own cost, which neighbours on a shared machine slow down but do not inflate.
                metrics["api_cpu_ms_per_request"] = 1000 * (server.api_cpu_s() - cpu0) / metrics["completed"]
                runs.append(
                    {"comparison": name, "server": server.name, "concurrency": c, "rep": rep, "position": position,
                     "workload": asdict(w), "metrics": metrics, "loadavg_1m": os.getloadavg()[0]}
                )
                log(
                    f"{name} rep {rep + 1}/{opts.repetitions} c={c} {server.name}: {metrics['request_throughput']:.2f} req/s, "
                    f"{metrics['output_throughput']:.0f} tok/s, TTFT p50 {metrics['ttft_p50_ms']:.1f} ms, "
                    f"TPOT p50 {metrics['tpot_p50_ms']:.2f} ms, API CPU {metrics['api_cpu_ms_per_request']:.1f} ms/req"
                )
    return runs


def _start(server: srv.Server) -> srv.Server:
    log(f"starting {server.name} on {server.url} (log {server.log_path})")
    server.start()
    took = server.wait_ready()
    log(f"{server.name} ready after {took:.0f} s")
    return server


def _parity(ours_log: Path, engine_args: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments our running service decided (from its startup report) vs those vLLM got."""
    for line in ours_log.read_text(errors="replace").splitlines():
        if "startup report {" in line:
            report = json.loads(line.split("startup report ", 1)[1])
            decided = {
                d["setting"].removeprefix("engine."): d["value"]
                for d in report["decisions"]
                if d["setting"].startswith("engine.") and d["value"] is not None
            }
            return {"same": decided == engine_args, "service": decided, "vllm": engine_args}
    return {"same": None, "reason": "no startup report in the service log"}


def _profile(server: srv.Server, c: int, opts: BenchOptions, model: str, served: str, logdir: Path) -> dict[str, Any]:
    """py-spy (sampling, non-blocking) on the server's API process during one extra, uncounted run."""
    from service.bench import profile

    out = logdir / f"py-spy-{server.name}-c{c}.folded"
    rec = profile.start_record(server.pid, out)
    if rec is None:
        return {"error": "py-spy not installed (pip install -e '.[bench]')"}
    time.sleep(1)
    cpu0, t0 = server.api_cpu_s(), time.monotonic()
    try:
        w = Workload(c, opts.num_prompts(c), opts.input_len, opts.output_len, seed=4242)
        metrics = run_load(w, server.url, model, served, logdir / "client-profile.log")
    finally:
        profile.stop_record(rec)
    if not out.exists():
        return {"error": f"py-spy wrote nothing (exit {rec.returncode}); ptrace not permitted?"}
    summary = profile.summarize(out.read_text())
    summary.update(
        concurrency=c, folded=str(out), wall_s=time.monotonic() - t0, api_cpu_s=server.api_cpu_s() - cpu0,
        output_throughput=metrics["output_throughput"],
    )
    return summary


def run_bench(opts: BenchOptions, command: str | None = None) -> int:
    from service.bench import report as rep
    from service.bench.bandwidth import read_bandwidth
    from service.bench.models import bytes_per_token, ensure_bench_model, parameters
    from service.demo_model import DEMO_NAME, ensure_demo_model
    from service.policy.dtype import BYTES

    started = dt.datetime.now()
    stamp = started.strftime("%Y%m%d-%H%M%S") + ("-quick" if opts.quick else "")
    out = opts.results_dir / stamp
    logdir = out / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    command = command or "python -m service bench" + (" --quick" if opts.quick else "")
    log(f"results in {out}")

    settings, report = policy_report("", {})  # machine facts only
    model = str(ensure_demo_model(settings.cache_dir))
    served = DEMO_NAME
    settings, report = policy_report(model, {})
    results: dict[str, Any] = {
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "machine": machine(report),
        "model": {"path": model, "served_name": served, "facts": report.to_dict()["model"]},
        "policy": {"engine_args": report.plan.engine_args, "env": report.plan.env},
        "note": "2 cores shared with other workers: absolute numbers are noisy, ratios are side by side in one run",
    }
    comparisons: list[Comparison] = []
    live: list[srv.Server] = []
    try:
        # 1. Front end: our service vs vLLM's own server, same engine arguments and environment.
        ours = _start(srv.ours(model, served, {}, logdir / "server-ours.log"))
        live.append(ours)
        results["parity"] = _parity(ours.log_path, report.plan.engine_args)
        vllm = _start(srv.vllm_with_policy(model, served, report, settings.max_queued_requests, logdir / "server-vllm.log"))
        live.append(vllm)
        results["startup_s"] = {"ours": ours.started_s, "vllm": vllm.started_s}
        for server in (ours, vllm):
            log(f"warm-up round on {server.name} (discarded)")
            _warm(server, opts, model, served, logdir)
        runs = _paired_runs("frontend", (ours, vllm), opts, model, served, logdir)
        results["frontend"] = {"runs": runs}
        comparisons += [compare("frontend", "ours", "vllm", c, runs) for c in opts.concurrencies]
        if opts.profile:
            worst = min((c for c in comparisons if c.name == "frontend"), key=lambda c: c.throughput_ratio).concurrency
            log(f"py-spy on both API processes at c={worst} (the worst ratio), one extra uncounted run each")
            results["frontend"]["profile"] = {s.name: _profile(s, worst, opts, model, served, logdir) for s in (ours, vllm)}
        ours.stop()
        live.remove(ours)

        # 2. Policy vs vLLM's defaults, both through vLLM's own server.
        if opts.policy:
            kv = report.plan.engine_args.get("kv_cache_memory_bytes")
            defaults = _start(srv.vllm_defaults(model, served, kv, logdir / "server-vllm-defaults.log"))
            live.append(defaults)
            results["startup_s"]["vllm-defaults"] = defaults.started_s
            _warm(defaults, opts, model, served, logdir)
            runs = _paired_runs("policy", (vllm, defaults), opts, model, served, logdir)
            results["policy_vs_defaults"] = {"runs": runs, "defaults_argv": defaults.argv}
            comparisons += [compare("policy", "vllm", "vllm-defaults", c, runs) for c in opts.concurrencies]
            defaults.stop()
            live.remove(defaults)
        vllm.stop()
        live.remove(vllm)

        # 3. Batch-1 decode against the memory-bandwidth ceiling, bf16 and fp32.
        decode: list[DecodeResult] = []
        if opts.decode:
            log("building the bandwidth-bound model (random weights, once)")
            big = str(ensure_bench_model(settings.cache_dir))
            engine_cpus = list(report.plan.threads.ranks[0])
            results["decode"] = {"model": big, "parameters": parameters(), "engine_cpus": engine_cpus, "runs": []}
            for dtype in opts.dtypes:
                before = read_bandwidth(engine_cpus)
                log(f"read bandwidth on CPU(s) {engine_cpus}: {before['gbs']:.1f} GB/s {before['by_op_gbs']}")
                server = _start(
                    srv.ours(big, "bench-llama", {"SERVICE_DTYPE": dtype, "SERVICE_KV_CACHE_GIB": "1"}, logdir / f"server-decode-{dtype}.log")
                )
                live.append(server)
                run_load(Workload(1, 1, opts.decode_input_len, 8, seed=7), server.url, big, "bench-llama", logdir / "client-decode.log")
                w = Workload(1, opts.decode_prompts, opts.decode_input_len, opts.decode_output_len, seed=11)
                metrics = run_load(w, server.url, big, "bench-llama", logdir / "client-decode.log")
                server.stop()
                live.remove(server)
                after = read_bandwidth(engine_cpus)
                bw = max(before["gbs"], after["gbs"])
                d = DecodeResult(dtype, metrics["tpot_p50_ms"], bw, bytes_per_token(BYTES[dtype]))
                decode.append(d)
                results["decode"]["runs"].append(
                    {**d.as_dict(), "metrics": metrics, "bandwidth_before": before, "bandwidth_after": after,
                     "startup_s": server.started_s}
                )
                log(decode_line(d))
            results["decode"]["faster"] = faster_dtype(decode)
    finally:
        for server in live:
            server.stop()

    results["comparisons"] = [c.as_dict() for c in comparisons]
    results["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    results["machine"]["loadavg_end"] = os.getloadavg()
    during = [r["loadavg_1m"] for part in ("frontend", "policy_vs_defaults") for r in results.get(part, {}).get("runs", [])]
    results["machine"]["loadavg_1m_max_during_runs"] = max(during) if during else None
    results["summary"] = [summary_line(c) for c in comparisons] + [decode_line(d) for d in decode]
    results["headline"] = headline(comparisons)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "table.md").write_text(rep.markdown(results, comparisons, decode))
    plots = rep.plots(out, comparisons, decode)
    latest = opts.results_dir / ("latest-quick" if opts.quick else "latest")
    with contextlib.suppress(FileNotFoundError):
        latest.unlink()
    latest.symlink_to(out.name)
    log(f"wrote {out / 'results.json'}, {out / 'table.md'}, {', '.join(p.name for p in plots)}")
    for line in results["summary"]:
        print(line)
    print(results["headline"])
    return 0
