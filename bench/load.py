"""The load: vLLM's own benchmark client (`vllm.benchmarks.serve`, what `vllm bench serve` runs), in this process,
on CPUs of its own where the machine has them, with its own CPU use and run-queue wait recorded."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import extract_metrics, with_asked_output_lengths

# A load generator that waited this share of its run for a CPU it was ready to use stamped its times late.
STARVED_WAIT_SHARE = 0.05


@dataclass(frozen=True)
class Workload:
    """One random workload: fixed lengths (range ratio 0), ignore_eos, greedy, closed loop at `concurrency`."""

    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    seed: int
    # A connection per request: llama-server's HTTP library closes an idle kept-alive connection after 5 s, the
    # client keeps it for 60 s, and a request sent on one the server was closing failed ("Cannot write to closing
    # transport"). Requests of seconds do not notice the connect.
    fresh_connections: bool = False

    def argv(self, base_url: str, model_path: str, served_name: str) -> list[str]:
        fresh = ["--header", "Connection=close"] if self.fresh_connections else []
        return fresh + [
            "--backend",
            "openai",
            "--base-url",
            base_url,
            "--endpoint",
            "/v1/completions",
            "--model",
            model_path,  # also the tokenizer the client builds prompts with
            "--served-model-name",
            served_name,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(self.input_len),
            "--random-output-len",
            str(self.output_len),
            "--random-range-ratio",
            "0",
            "--num-prompts",
            str(self.num_prompts),
            "--max-concurrency",
            str(self.concurrency),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--temperature",
            "0",
            "--seed",
            str(self.seed),
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--num-warmups",
            "0",
            "--ready-check-timeout-sec",
            "0",
            "--disable-tqdm",
            # Keeps the per-request arrays (ttfts, itls, errors) in the returned result; nothing is written.
            "--save-detailed",
        ]


@dataclass(frozen=True)
class ClientCpus:
    """Where the load generator runs: CPUs no server uses, else (a machine too small) the API servers' CPUs."""

    cpus: tuple[int, ...]
    own: bool  # False: shared with the servers' API processes (never with the engine's compute cores if avoidable)
    note: str


def client_cpus(allowed: Sequence[int], engine: Sequence[int], reserved: Sequence[int]) -> ClientCpus:
    free = tuple(c for c in allowed if c not in set(engine) | set(reserved))
    if free:
        return ClientCpus(
            free,
            True,
            f"load generator on CPU(s) {list(free)} of its own (engine {list(engine)}, API {list(reserved)})",
        )
    shared = tuple(reserved) or tuple(allowed)
    return ClientCpus(
        shared,
        False,
        f"load generator SHARES CPU(s) {list(shared)} with the API servers: {len(allowed)} CPU(s), engine on "
        f"{list(engine)}, API on {list(reserved)}, none left for it (its CPU use and run-queue wait are recorded "
        f"per run; a run where it waited > {STARVED_WAIT_SHARE:.0%} of the time is flagged starved)",
    )


def _tasks() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


@contextlib.contextmanager
def pinned(cpus: Sequence[int] | None) -> Iterator[None]:
    """Every thread of this process on `cpus` for the duration (servers started later do not inherit it)."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    for tid in _tasks():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for tid in _tasks():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before)


def _run_queue_wait_s() -> float:
    """Seconds this process's threads have spent runnable but waiting for a CPU (schedstat's second field)."""
    total = 0
    for tid in _tasks():
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[1])
    return total / 1e9


def client_args(argv: list[str]) -> Any:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(argv)


@contextlib.contextmanager
def requests_window(sample: Callable[[], float] | None) -> Iterator[list[float]]:
    """vLLM's benchmark client scrapes the server's /metrics twice right before its requests and twice right after
    them, for speculative-decoding and diffusion counters (neither applies here). One scrape costs the API process
    ~8 ms of CPU (660-710 lines of exposition; measured 2026-11-23), which is not the server's cost of serving the
    requests. For the run, its two scrape functions answer "no such counters" without asking the server, and the
    first one takes `sample()` instead: the yielded list then holds its value before and after the requests."""
    from vllm.benchmarks import serve

    marks: list[float] = []

    async def spec_decode(base_url: str, session: Any) -> None:
        if sample is not None:
            marks.append(sample())

    async def diffusion(base_url: str, session: Any) -> None:
        return None

    saved = serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics
    serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics = spec_decode, diffusion
    try:
        yield marks
    finally:
        serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics = saved


def run_load(
    workload: Workload,
    base_url: str,
    model_path: str,
    served_name: str,
    log: Path,
    cpus: Sequence[int] | None = None,
    generated: Callable[[], float] | None = None,
    api_cpu: Callable[[], float] | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """Run vllm.benchmarks.serve once; its printed report goes to `log`. Returns the metrics we keep and the
    client's own figures (CPU share, run-queue wait share, starved). `generated` reads the server's own count of
    generated tokens: where the client counted other than asked, and the server's count says it generated exactly
    what was asked, the metrics are recomputed with the asked lengths (stats.with_asked_output_lengths). `api_cpu`
    reads the server's API-process CPU seconds: its use from the first request to the last (requests_window), per
    completed request, becomes `api_cpu_ms_per_request`."""
    from vllm.benchmarks.serve import main_async

    asked = workload.num_prompts * workload.output_len
    args = client_args(workload.argv(base_url, model_path, served_name))
    before = generated() if generated else None
    with open(log, "a") as out, contextlib.redirect_stdout(out), pinned(cpus), requests_window(api_cpu) as marks:
        print(f"===== {base_url} {workload}", flush=True)
        wall0, cpu0, wait0 = time.monotonic(), time.process_time(), _run_queue_wait_s()
        result = asyncio.run(main_async(args))
        wall, cpu, wait = time.monotonic() - wall0, time.process_time() - cpu0, _run_queue_wait_s() - wait0
    gc.unfreeze()  # main_async freezes the heap for its run; let the next run start clean
    server_count = generated() - before if generated and before is not None else None
    metrics = extract_metrics(result)
    if metrics["failed"] or metrics["completed"] != workload.num_prompts:
        errors = [e for e in result.get("errors", []) if e][:3]
        raise RuntimeError(f"{base_url}: {int(metrics['failed'])} request(s) failed: {errors}")
    client_count = metrics["total_output_tokens"]
    if client_count != asked and server_count == asked:
        metrics = extract_metrics(with_asked_output_lengths(result, workload.output_len))
    if api_cpu is not None:
        if len(marks) != 2:
            raise RuntimeError(
                f"vLLM's benchmark client called fetch_spec_decode_metrics {len(marks)} time(s), not once before and "
                "once after its requests: the API CPU window (bench/load.py requests_window) needs a new anchor"
            )
        metrics["api_cpu_ms_per_request"] = 1000 * (marks[1] - marks[0]) / metrics["completed"]
    client = {
        # Fixed lengths with ignore_eos: any other count means the server stopped early or counts differently.
        "output_tokens_as_asked": metrics["total_output_tokens"] == asked,
        "output_tokens_counted_by_client": client_count,
        "output_tokens_counted_by_server": server_count,
        "cpus": list(cpus) if cpus else None,
        "wall_s": wall,
        "cpu_share": cpu / wall,
        "run_queue_wait_share": wait / wall,
        "starved": wait / wall > STARVED_WAIT_SHARE,
    }
    return metrics, client
