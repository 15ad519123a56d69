"""Tables, py-spy summaries, the decode model's byte count and the client's arguments of the bench."""
from __future__ import annotations

import pytest

from service.bench import models, profile
from service.bench.load import Workload
from service.bench.report import comparison_table, decode_table, markdown
from service.bench.stats import DecodeResult, compare, extract_metrics


def _run(server, c, rep, req_s, ttft):
    result = {
        "duration": 5.0, "completed": 8, "failed": 0, "request_throughput": req_s, "output_throughput": req_s * 64,
        "p50_ttft_ms": ttft, "p99_ttft_ms": ttft + 10, "p50_tpot_ms": 8.0, "p99_tpot_ms": 9.0, "p50_itl_ms": 8.0,
    }
    return {"server": server, "concurrency": c, "rep": rep, "metrics": extract_metrics(result)}


@pytest.fixture
def comparisons():
    runs = [_run("ours", 4, 0, 2.0, 30.0), _run("vllm", 4, 0, 2.0, 29.0), _run("ours", 16, 0, 3.0, 90.0), _run("vllm", 16, 0, 3.2, 80.0)]
    return [compare("frontend", "ours", "vllm", c, runs) for c in (4, 16)]


def test_comparison_table_has_both_servers_and_the_ratio(comparisons):
    lines = comparison_table(comparisons).splitlines()
    assert lines[0].startswith("| comparison | c | server | req/s | out tok/s | TTFT p50 ms")
    assert len(lines) == 2 + 3 * 2
    assert "| frontend | 4 | ours | 2.00 | 128.0 | 30.0 | 40.0 | 8.00 | 9.00 |  |" in lines
    assert any("**ratio ours/vllm**" in line and "**1.000**" in line and "+1.0" in line and "meets target" in line for line in lines)
    assert any("| 16 |" in line and "**0.938**" in line and "BELOW TARGET" in line for line in lines)


def test_decode_table_and_markdown(comparisons):
    d = DecodeResult("bfloat16", 100.0, 10.0, 1_000_000_000)
    table = decode_table([d])
    assert "| bfloat16 | 1.00 GB | 10.0 GB/s | 10.00 | 10.00 | **100%** | 10.0 |" in table
    results = {
        "command": "python -m service bench --quick", "started": "s", "finished": "f",
        "machine": {
            "cpu": "Xeon", "family_model": "6/167", "microarchitecture": "icelake", "hypervisor": True,
            "isa": {"avx2": True, "amx": True, "avx512_bf16": False}, "physical_cores": 2, "memory_gib": 23.5,
            "engine_cpus": [[0]], "reserved_cpus": [1], "software": {"torch": "2.13.0+cpu", "vllm": "0.32.0"},
            "loadavg_start": (1.0, 1.0, 1.0), "loadavg_end": (2.0, 1.0, 1.0),
        },
        "options": {"input_len": 128, "output_len": 64, "repetitions": 1},
        "model": {"served_name": "demo-tiny-llama"},
        "decode": {"model": "/x/bench-llama-0.5b-v1", "parameters": 5e8},
        "summary": ["line one"], "headline": "frontend throughput ratio ours/vllm: 0.938",
    }
    md = markdown(results, comparisons, [d])
    assert md.startswith("Command: `python -m service bench --quick`")
    assert "KVM guest" in md and "ISA: avx2, amx;" in md
    assert "bench-llama-0.5b-v1" in md
    assert md.rstrip().endswith("frontend throughput ratio ours/vllm: 0.938\n```")


def test_py_spy_summary_self_and_areas():
    folded = "\n".join([
        "<module> (service/__main__.py:1);run (/x/lib/python3.11/asyncio/base_events.py:10);dispatch (/x/site-packages/starlette/middleware/base.py:5) 30",
        "<module> (service/__main__.py:1);run (/x/lib/python3.11/asyncio/base_events.py:10);create_completion (/x/site-packages/vllm/entrypoints/openai/completion/serving.py:7) 70",
        "garbage line",
    ])
    s = profile.summarize(folded)
    assert s["samples"] == 100
    assert s["self"][0] == ("create_completion (vllm/entrypoints/openai/completion/serving.py)", 0.7)
    areas = dict(s["by_area"])
    assert areas["vLLM OpenAI serving (request parsing, detokenized streaming)"] == 0.7
    assert areas["starlette (ASGI routing, middleware)"] == 0.3
    assert profile.summarize("")["samples"] == 0


def test_bench_model_is_bandwidth_bound_size():
    assert 0.45e9 < models.parameters() < 0.55e9
    # every weight but the input embedding table is read once per decoded token
    embed = models.CONFIG["vocab_size"] * models.CONFIG["hidden_size"]
    assert models.bytes_per_token(2) == (models.parameters() - embed) * 2
    assert models.bytes_per_token(4) == 2 * models.bytes_per_token(2)


def test_workload_arguments_fix_the_lengths_and_ignore_eos():
    argv = Workload(4, 16, 128, 64, seed=3).argv("http://127.0.0.1:1", "/m", "demo")
    opts = dict(zip(argv[::1], argv[1:] + [""]))
    assert opts["--random-input-len"] == "128" and opts["--random-output-len"] == "64"
    assert opts["--random-range-ratio"] == "0" and opts["--max-concurrency"] == "4"
    assert opts["--num-prompts"] == "16" and opts["--seed"] == "3" and opts["--dataset-name"] == "random"
    assert "--ignore-eos" in argv and opts["--metric-percentiles"] == "50,99"
