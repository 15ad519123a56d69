"""bench/report.py: table.md from a finished run, each part's section in it."""

from __future__ import annotations

import pytest

from bench.report import markdown
from bench.servers import Reported
from bench.stats import DecodeResult
from bench.tables import decode_table
from tests.unit.bench.bench_results import HARDWARE, frontend_comparisons
from tests.unit.bench.bench_results import results as recorded


@pytest.fixture
def comparisons():
    return frontend_comparisons()


def test_decode_table_and_markdown(comparisons):
    d = DecodeResult("bfloat16", 100.0, 10.0, 1_000_000_000)
    assert "| bfloat16 | 1.00 GB | 10.0 GB/s | 10.00 | 10.00 | **100%** |  | 10.0 |" in decode_table([d])
    rounds = DecodeResult("bfloat16", 100.0, 10.0, 1_000_000_000, (0.82, 0.84, 0.83))
    assert "| **83.0% [80.5%, 85.5%]** | met | 10.0 |" in decode_table([rounds])
    results = {
        "command": "python -m bench --quick",
        "started": "s",
        "finished": "f",
        "machine": Reported(HARDWARE).machine() | {"client": {"note": "load generator on CPU(s) [3] of its own"}},
        "host": {"loadavg_start": (1.0, 1.0, 1.0), "loadavg_end": (2.0, 1.0, 1.0), "loadavg_1m_max_during_runs": 3.0},
        "options": {"input_len": 128, "output_len": 64, "rounds": 2},
        "model": {"served_name": "demo-tiny-llama"},
        "decode": {
            "model": "/x/bench-llama-0.5b-v1",
            "runs": [
                {
                    "dtype": "bfloat16",
                    "tpot_p50_ms": 20.0,
                    "profile": {"samples": 900, "by_area": [("linear layers (oneDNN GEMM)", 0.7)]},
                }
            ],
        },
        "summary": ["line one"],
        "headline": "frontend throughput ratio ours/vllm: 0.950",
    }
    md = markdown(results, comparisons, [d])
    assert md.startswith("Command: `python -m bench --quick`")
    assert "ISA: avx2, avx512_bf16;" in md and "engine computes on CPU(s) [0, 1]" in md
    assert "load generator on CPU(s) [3] of its own" in md and "up to 3.0 during the runs" in md
    assert "bench-llama-0.5b-v1" in md
    assert (
        "Where a bfloat16 decode step goes (py-spy --native on the engine process, one extra run, 900 samples; "
        "ms at its TPOT p50): linear layers (oneDNN GEMM) 70% (14.0 ms)." in md
    )
    assert md.rstrip().endswith("frontend throughput ratio ours/vllm: 0.950\n```")


def test_preload_and_warm_start_sections():
    results = recorded(
        "python -m bench",
        preload={
            "model": "/x/bench-llama-0.5b-v1",
            "max_tokens": 128,
            "requests_per_start": 3,
            "runs": [
                {
                    "variant": "with",
                    "decisions": {
                        "env.LD_PRELOAD": {"setting": "env.LD_PRELOAD", "value": "/l/libtcmalloc.so:/l/libiomp5.so"}
                    },
                },
                {
                    "variant": "without",
                    "decisions": {
                        "env.LD_PRELOAD": {"setting": "env.LD_PRELOAD", "value": "/t/libgomp.so", "source": "user"}
                    },
                },
            ],
            "median_tok_s": {"with": 8.1, "without": 7.9},
            "variants": ["with", "without"],
            "ratios": [1.02, 1.03],
            "estimate": "x1.025 [0.961, 1.093]",
        },
        warm_start=[
            {
                "name": "bench",
                "cold": {
                    "ready_s": 300.0,
                    "engine_init_s": 200.1,
                    "loaded_compiled": False,
                    "compiled_and_saved": True,
                },
                "warm": {"ready_s": 90.0, "engine_init_s": 30.2, "loaded_compiled": True, "compiled_and_saved": False},
            },
            {
                "name": "default",
                "cold": {
                    "ready_s": 40.0,
                    "stop_s": 5.3,
                    "engine_init_s": 20.1,
                    "loaded_compiled": False,
                    "compiled_and_saved": True,
                    "engine_core_killed": True,
                },
                "warm": {
                    "ready_s": 20.0,
                    "stop_s": 1.6,
                    "engine_init_s": 8.2,
                    "loaded_compiled": True,
                    "compiled_and_saved": False,
                    "engine_core_killed": False,
                },
            },
        ],
    )
    md = markdown(results, [], [])
    assert "with its own preload (`LD_PRELOAD=/l/libtcmalloc.so:/l/libiomp5.so`)" in md
    assert "with 8.10 tok/s, without 7.90 tok/s; with/without x1.025 [0.961, 1.093]." in md
    assert "| bench | 300 s | 90 s | 200.1 s | 30.2 s | loaded the compiled graph | not measured |" in md
    assert (
        "| default | 40 s | 20 s | 20.1 s | 8.2 s | loaded the compiled graph | 5.3 s, 1.6 s "
        "(engine core SIGKILLed by vLLM: cold) |" in md
    )


def test_dtype_section_names_the_cpu_class_and_both_ratios():
    dtype = {
        "model": "/x/bench-llama-0.5b-v1",
        "cpu": "AuthenticAMD AMD EPYC (zen)",
        "isa_class": "avx2",
        "max_tokens": 32,
        "requests_per_start": 3,
        "median_tok_s": {"bfloat16": 4.63, "float32": 5.01},
        "ratios": [0.917, 0.914, 0.870],
        "prefill_ratios": [0.159, 0.156, 0.158],
        "estimate": "x0.900 [0.836, 0.969]",
        "prefill_estimate": "x0.157 [0.153, 0.162]",
    }
    md = markdown(recorded("python -m bench --dtype", dtype=dtype), [], [])
    assert "on AuthenticAMD AMD EPYC (zen) (avx2)" in md and "3 repetitions" in md
    assert "bf16/fp32 decode x0.900 [0.836, 0.969], prefill x0.157 [0.153, 0.162]." in md


def test_peer_markdown_says_which_runs_were_recounted_and_which_cells_were_left_out(comparisons):
    import dataclasses

    peer = [dataclasses.replace(c, name="peer-q8_0", targets=(), verdicts={}) for c in comparisons[:1]]
    counted = {"output_tokens_counted_by_client": 15.0, "output_tokens_counted_by_server": 96.0}
    results = recorded(
        "python -m bench --only-peer",
        options={"input_len": 128, "output_len": 64, "rounds": 2, "peer_input_len": 128, "peer_output_len": 32},
        peer={
            "llama_server": "llama.cpp",
            "threads": 1,
            "engine_cpus": [0],
            "runs": [{"client": counted}, {"client": {"output_tokens_counted_by_server": None}}],
            "failed": [{"comparison": "peer-q8_0", "concurrency": 16, "rep": 0, "error": "2 request(s) failed"}],
        },
    )
    md = markdown(results, peer, [])
    assert "In 1 of 1 llama.cpp runs vLLM's client counted fewer output tokens" in md
    assert "Left out: peer-q8_0 c=16 repetition 1: 2 request(s) failed" in md
    assert "Workload: vllm.benchmarks.serve" not in md  # the front end's paragraph, absent without its table
