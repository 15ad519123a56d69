"""What the parts of one bench run share: its options, output folder and logs, the service's latest report, the
client's CPUs; starting servers; and the A/B engine: both servers restarted per repetition in alternating start
order, A/B and B/A runs by turns on each pair of processes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import servers as srv
from bench.load import ClientCpus, Workload, client_cpus, run_load
from bench.options import BenchOptions
from bench.output import log
from harness import ServerProcess

REPACK_OFF = {"LLAMA_ARG_REPACK": "0"}  # llama.cpp's --no-repack, for its server and its tools
# Exit codes of a llama.cpp program killed while it loads with repacking on (its AMX path in Intel guests with AMX:
# `tilezero` raised SIGILL on one, a general protection fault in libggml-cpu on another), and what the bench calls them
LOAD_CRASHES = {-signal.SIGILL: "SIGILL (an illegal instruction)", -signal.SIGSEGV: "SIGSEGV (a protection fault)"}


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
    ) -> tuple[dict[str, float], dict[str, Any]]:
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
    seed_base: int,
    after_last: Callable[[dict[str, ServerProcess], list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Per repetition: start both servers anew (the first of `sides` first in even repetitions, second in odd ones),
    warm both, then per concurrency of the options `rounds` pairs of runs on the same workload (the options' lengths,
    a seed of its own per repetition, round and concurrency), in the order `round_order` gives."""
    opts = ctx.opts
    rounds, concurrencies = opts.rounds, opts.concurrencies

    def workload(c: int, rep: int, rnd: int) -> Workload:
        return Workload(c, opts.num_prompts(c), opts.input_len, opts.output_len, seed=seed_base * rep + 10 * rnd + c)

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
                server = live[side.name]
                assert server.proc is not None  # started above
                if (
                    server.proc.poll() is not None
                    or httpx.get(server.url + server.ready_path, timeout=10).status_code != 200
                ):
                    raise RuntimeError(f"{side.name} stopped serving while the other started:\n{server.log_tail()}")
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


def profile_api(server: ServerProcess, c: int, ctx: Context) -> dict[str, Any]:
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


def cache_dir() -> Path:
    """The service's model cache (configs/default.yaml < SERVICE_CACHE_DIR), read from its settings."""
    from service.settings import load_settings

    return load_settings(None).cache_dir
