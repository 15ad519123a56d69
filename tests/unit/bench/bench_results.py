"""Recorded bench results for the bench's unit tests: runs as vllm.benchmarks.serve reports them, comparisons of them,
what the service's GET /v1/hardware answers, and a finished run's results.json."""

from __future__ import annotations

from bench.servers import Reported
from bench.stats import FRONTEND_TARGETS, compare, extract_metrics


def run_record(server, c, rep, tok_s, ttft):
    result = {
        "duration": 5.0,
        "completed": 8,
        "failed": 0,
        "request_throughput": tok_s / 64,
        "output_throughput": tok_s,
        "p50_ttft_ms": ttft,
        "p99_ttft_ms": ttft + 10,
        "p50_tpot_ms": 8.0,
        "p99_tpot_ms": 9.0,
        "p50_itl_ms": 8.0,
        "total_output_tokens": 512,
    }
    return {
        "server": server,
        "concurrency": c,
        "rep": rep,
        "metrics": extract_metrics(result),
        "client": {"starved": False},
    }


def frontend_comparisons():
    runs = [
        run_record("ours", 4, 0, 128.0, 30.0),
        run_record("vllm", 4, 0, 128.0, 29.0),
        run_record("ours", 4, 1, 130.0, 30.0),
        run_record("vllm", 4, 1, 126.0, 29.0),
        run_record("ours", 16, 0, 190.0, 90.0),
        run_record("vllm", 16, 0, 200.0, 80.0),
    ]
    return [compare("frontend", "ours", "vllm", c, runs, FRONTEND_TARGETS) for c in (4, 16)]


# What GET /v1/hardware answers (the parts the bench reads), as the service's StartupReport.to_dict() writes it.
HARDWARE = {
    "hardware": {
        "model_name": "Xeon",
        "family": 6,
        "model": 207,
        "microarchitecture": "emeraldrapids",
        "isa": {"avx2": True, "avx512_bf16": True, "amx": False},
        "physical_cores": 4,
        "logical_cpus": 4,
        "numa_nodes": {"0": "0-3"},
        "memory_limit_bytes": 8 * 1024**3,
        "allowed_cpus": [0, 1, 2, 3],
    },
    "software": {"torch": "2.13.0+cpu", "vllm": "0.32.0"},
    "backend": {"name": "avx512"},
    "threads": {"tensor_parallel_size": 1, "ranks": ["0-1"], "reserved": "2"},
    "decisions": [
        {"setting": "engine.tensor_parallel_size", "value": 1},
        {"setting": "engine.enable_prefix_caching", "value": False},
        {"setting": "engine.max_model_len", "value": None},
        {"setting": "env.VLLM_CPU_OMP_THREADS_BIND", "value": "0-1"},
        {"setting": "worker_env.KMP_AFFINITY", "value": ["x"]},
        {"setting": "patch.vllm_aot_compile_cache", "value": True},
    ],
    # What the service hands to vLLM (a note such as engine.max_model_len=None is not passed).
    "engine_args": {"tensor_parallel_size": 1, "enable_prefix_caching": False},
    "env": {"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
}


def results(command: str, options: dict | None = None, **parts) -> dict:
    """A finished run's results as bench.report reads them: the machine and host parts, and `parts`."""
    return {
        "command": command,
        "started": "s",
        "finished": "f",
        "machine": Reported(HARDWARE).machine(),
        "host": {"loadavg_start": (1.0, 1.0, 1.0), "loadavg_end": (2.0, 1.0, 1.0)},
        "options": options or {"input_len": 128, "output_len": 64, "rounds": 2},
        "model": {"served_name": "demo-tiny-llama"},
        "summary": [],
        **parts,
    }
