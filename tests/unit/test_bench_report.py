"""Tables, py-spy summaries, the decode model's byte count, the client's arguments and CPUs, and what the bench reads
from the service's GET /v1/hardware to start vLLM's server with the same engine."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from bench import models, profile
from bench.load import Workload, client_cpus, requests_window
from bench.report import comparison_table, decode_table, markdown
from bench.runner import BenchOptions, Side, round_order
from bench.servers import MAX_QUEUED, Reported, vllm_argv, vllm_defaults, vllm_same_engine
from bench.stats import FRONTEND_TARGETS, DecodeResult, compare, extract_metrics


def _run(server, c, rep, tok_s, ttft):
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


@pytest.fixture
def comparisons():
    runs = [
        _run("ours", 4, 0, 128.0, 30.0),
        _run("vllm", 4, 0, 128.0, 29.0),
        _run("ours", 4, 1, 130.0, 30.0),
        _run("vllm", 4, 1, 126.0, 29.0),
        _run("ours", 16, 0, 190.0, 90.0),
        _run("vllm", 16, 0, 200.0, 80.0),
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
}


def test_table_shows_medians_estimates_intervals_and_verdicts(comparisons):
    lines = comparison_table(comparisons).splitlines()
    assert (
        lines[0]
        == "| comparison | c | n | servers | out tok/s | TTFT p50 ms | TPOT p50 ms | API CPU ms/req | verdict |"
    )
    assert len(lines) == 2 + 2
    assert lines[2].startswith("| frontend | 4 | 2 | ours / vllm | 129.0 / 127.0: **x1.016 [")
    assert "30.0 / 29.0: **+1.00 [+1.00, +1.00]** met" in lines[2]
    assert lines[3].endswith("| unresolved |")  # one repetition: no interval, nothing decided
    assert "[n=1, no interval]" in lines[3]


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
                {"dtype": "bfloat16", "profile": {"samples": 900, "by_area": [("linear layers (oneDNN GEMM)", 0.7)]}}
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
        "Where a bfloat16 decode step goes (py-spy --native on the engine process, one extra run, 900 samples): " in md
    )
    assert "linear layers (oneDNN GEMM) 70%." in md
    assert md.rstrip().endswith("frontend throughput ratio ours/vllm: 0.950\n```")


def test_reported_engine_arguments_environment_and_cpus():
    r = Reported(HARDWARE)
    assert r.engine_args == {"tensor_parallel_size": 1, "enable_prefix_caching": False}
    assert r.env == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert r.engine_cpus == [0, 1] and r.reserved_cpus == [2] and r.allowed_cpus == [0, 1, 2, 3]
    assert r.machine()["family_model"] == "6/207" and r.machine()["memory_gib"] == 8.0


def test_vllm_gets_the_reported_engine_arguments_and_environment(tmp_path):
    r = Reported(HARDWARE)
    server = vllm_same_engine("/m", "demo", r, tmp_path / "log")
    argv = server.argv
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "{port}"
    assert "--tensor-parallel-size" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert "--no-enable-prefix-caching" in argv
    assert argv[-2:] == ["--max-num-queued-reqs", str(MAX_QUEUED)]
    assert server.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and server.ready_path == "/v1/models"
    assert not any(k.startswith("SERVICE_") for k in server.env)
    defaults = vllm_defaults("/m", "demo", 1 << 30, tmp_path / "log2").argv
    assert defaults[-2:] == ["--kv-cache-memory-bytes", str(1 << 30)]
    assert vllm_argv("/m", "demo", {}, None)[-2:] == ["--port", "{port}"]


def test_client_cpus_of_its_own_or_shared_and_said_so():
    own = client_cpus([0, 1, 2, 3], engine=[0, 1], reserved=[2])
    assert own.cpus == (3,) and own.own and "of its own" in own.note
    shared = client_cpus([0, 1], engine=[0], reserved=[1])
    assert shared.cpus == (1,) and not shared.own
    assert "SHARES CPU(s) [1] with the API servers" in shared.note and "2 CPU(s)" in shared.note


def test_py_spy_summary_self_and_areas():
    folded = "\n".join(
        [
            "<module> (service/__main__.py:1);run (/x/lib/python3.11/asyncio/base_events.py:10);dispatch (/x/site-packages/starlette/middleware/base.py:5) 30",
            "<module> (service/__main__.py:1);run (/x/lib/python3.11/asyncio/base_events.py:10);create_completion (/x/site-packages/vllm/entrypoints/openai/completion/serving.py:7) 70",
            "garbage line",
        ]
    )
    s = profile.summarize(folded)
    assert s["samples"] == 100
    assert s["self"][0] == ("create_completion (vllm/entrypoints/openai/completion/serving.py)", 0.7)
    areas = dict(s["by_area"])
    assert areas["vLLM OpenAI serving (request parsing, detokenized streaming)"] == 0.7
    assert areas["starlette (ASGI routing, middleware)"] == 0.3
    assert profile.summarize("")["samples"] == 0


def test_worker_profile_areas_take_the_innermost_known_native_frame():
    step = "run_engine_core (/x/site-packages/vllm/v1/engine/core.py:1);execute_model (/x/site-packages/vllm/v1/worker/cpu_model_runner.py:2)"
    folded = "\n".join(
        [
            f"{step};onednn_mm (/x/site-packages/vllm/_custom_ops.py:3);dnnl::impl::cpu::x64::brgemm (libdnnl.so);0x7f00 (?) 60",
            f"{step};onednn_mm (/x/site-packages/vllm/_custom_ops.py:3);__kmp_wait_template (libiomp5.so) 10",
            f"{step};cpu_attention_with_kv_cache (/x/site-packages/vllm/v1/attention/backends/cpu_attn.py:4) 20",
            f"{step} 10",
        ]
    )
    areas = dict(profile.summarize(folded, areas=profile.WORKER_AREAS)["by_area"])
    assert areas == {
        "linear layers (oneDNN JIT GEMM kernels)": 0.6,
        "attention over the KV cache": 0.2,
        "OpenMP runtime (barriers, waiting)": 0.1,
        "model runner (Python: inputs, metadata)": 0.1,
    }


def test_worker_profile_names_zendnn_jit_code_by_its_zentorch_caller():
    # As py-spy records a Zen 5 decode step: unnamed JIT code called from ZenDNN's bf16 kernel inside zentorch.
    step = "execute_model (/x/site-packages/vllm/v1/worker/cpu_model_runner.py:2)"
    zen = "amdzen::gen::jitAmdZenBF16::executeKernel (zentorch/libzentorch.so)"
    folded = "\n".join(
        [
            f"{step};0x7fff (?);{zen};0x7fa9 (?) 70",
            f"{step};onednn_mm (/x/site-packages/vllm/_custom_ops.py:3);0x7f00 (?) 20",
            f"{step};sched_yield (/x/site-packages/vllm/distributed/device_communicators/shm_broadcast.py:9) 10",
        ]
    )
    areas = dict(profile.summarize(folded, areas=profile.WORKER_AREAS)["by_area"])
    assert areas == {
        "linear layers (ZenDNN JIT GEMM kernels, zentorch)": 0.7,
        "linear layers (oneDNN JIT GEMM kernels)": 0.2,
        "engine-core <-> worker hand-off (shared-memory queue)": 0.1,
    }


def test_worker_profile_counts_only_the_compute_threads_and_names_jit_kernels():
    run = (
        "thread (11): MainThread;<module> (<string>:1);execute_model (/x/site-packages/vllm/v1/worker/gpu_worker.py:5)"
    )
    folded = "\n".join(
        [
            f"{run};runtime_wrapper (/x/site-packages/torch/_functorch/x.py:1);OpOverload.__call__ (torch/_ops.py:875);0x7f8a95fbe1cd (?) 90",
            f"{run};sample (/x/site-packages/vllm/v1/sample/sampler.py:2) 10",
            "thread (12): Thread-1;0x7f8adb5278ec (libc.so.6);read (libc.so.6) 300",
        ]
    )
    s = profile.summarize(folded, areas=profile.WORKER_AREAS, threads_with=profile.COMPUTE_THREADS)
    assert s["samples"] == 100 and s["samples_of_other_threads"] == 300 and s["threads"] == ["MainThread"]
    assert dict(s["by_area"]) == {"linear layers (oneDNN JIT GEMM kernels)": 0.9, "sampling and logits": 0.1}


def test_the_compute_process_is_found_among_descendants_by_vllm_s_process_title():
    """A server whose grandchild is titled as vLLM titles its engine core, and a process with no children."""
    engine = "import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(60)"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {engine!r}]); time.sleep(60)"
    server = subprocess.Popen([sys.executable, "-c", parent])
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        found = None
        while found is None and time.monotonic() < deadline:
            found = profile.compute_process(server.pid)
            time.sleep(0.1)
        assert found is not None and found != server.pid
        assert "VLLM::EngineCore" in " ".join(psutil.Process(found).cmdline())
        assert profile.compute_process(lone.pid) is None
    finally:
        for p in psutil.Process(server.pid).children(recursive=True) + [
            psutil.Process(server.pid),
            psutil.Process(lone.pid),
        ]:
            p.kill()
        server.wait()
        lone.wait()


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
    assert "--header" not in argv


def test_a_peer_workload_asks_for_a_connection_per_request():
    from bench.load import client_args

    argv = Workload(16, 32, 128, 32, seed=3, fresh_connections=True).argv("http://127.0.0.1:1", "/m", "demo")
    assert client_args(argv).header == ["Connection=close"]


def test_reported_reads_the_json_the_service_serves():
    # The field names the bench relies on are those of StartupReport.to_dict(); a round trip through JSON keeps them.
    assert Reported(json.loads(json.dumps(HARDWARE))).engine_args == Reported(HARDWARE).engine_args


def _results(command: str, options: dict | None = None, **parts) -> dict:
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


def test_peer_markdown_says_which_runs_were_recounted_and_which_cells_were_left_out(comparisons):
    import dataclasses

    peer = [dataclasses.replace(c, name="peer-q8_0", targets=(), verdicts={}) for c in comparisons[:1]]
    counted = {"output_tokens_counted_by_client": 15.0, "output_tokens_counted_by_server": 96.0}
    results = _results(
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


def _quant_row(fmt, kernel, decode, passes, **kw):
    return {
        "format": fmt,
        "env": kw.get("env", {}),
        "kernel": kernel,
        "decode": {"median": decode, "min": decode - 1, "max": decode + 1},
        "prefill": {"median": 500.0, "min": 450.0, "max": 510.0},
        "kernel_confirmed": kw.get("confirmed", True),
        "quality": {"top1": 0.97 if passes else 0.5, "mean_abs_dlogprob": 0.01 if passes else 0.4},
        "kernel_quality": {"top1": 0.99, "mean_abs_dlogprob": 0.005},
        "quality_passes": passes,
        "bytes_per_token": 505_000_000,
        "ceiling_fraction": 0.8,
    }


def test_quantized_kernel_table_flags_a_corrupted_copy_that_passes_and_an_unconfirmed_kernel():
    from bench.quant_kernels import heading, markdown_table

    report = {
        "machine": "GenuineIntel Xeon (emeraldrapids), backend avx512",
        "date": "2026-11-22 15:00 UTC",
        "reps": 3,
        "load_average": (0.5, 0.4, 0.3),
        "bandwidth": {"gbs": 11.2, "cpus": [1]},
        "rows": [
            _quant_row("w8a8", "onednn-w8a8", 21.0, True),
            _quant_row("w4a16", "wna16-vec", 6.0, True, confirmed=False, env={"VLLM_CPU_INT4_W4A8": "0"}),
            _quant_row("w8a8-corrupt", "onednn-w8a8", 21.0, True),
            {"format": "w8a8-static", "env": {}, "kernel": "onednn-w8a8", "error": "exit 1, log x.log"},
        ],
    }
    table = markdown_table(report).splitlines()
    assert table[2] == (
        "| w8a8 | `onednn-w8a8` | yes | 21.0 [20.0-22.0] | 500 [450-510] | 505 | 80% | 0.97, 0.010 | 0.99, 0.005 | pass |"
    )
    assert table[3].startswith("| w4a16 [VLLM_CPU_INT4_W4A8=0] | `wna16-vec` | NO |")
    assert table[4].endswith("| pass (expected fail) |")  # a corrupted scale that scores as correct is a finding
    assert table[5].startswith("| w8a8-static | onednn-w8a8 | exit 1, log x.log |")
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "11.2 GB/s on CPU(s) [1]" in heading(report) and "median [min-max] of 3 repetitions" in heading(report)


def test_preload_and_warm_start_sections():
    results = _results(
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
            }
        ],
    )
    md = markdown(results, [], [])
    assert "with its own preload (`LD_PRELOAD=/l/libtcmalloc.so:/l/libiomp5.so`)" in md
    assert "with 8.10 tok/s, without 7.90 tok/s; with/without x1.025 [0.961, 1.093]." in md
    assert "| bench | 300 s | 90 s | 200.1 s | 30.2 s | loaded the compiled graph |" in md


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
    md = markdown(_results("python -m bench --dtype", dtype=dtype), [], [])
    assert "on AuthenticAMD AMD EPYC (zen) (avx2)" in md and "3 repetitions" in md
    assert "bf16/fp32 decode x0.900 [0.836, 0.969], prefill x0.157 [0.153, 0.162]." in md


def test_rounds_alternate_the_order_so_a_drift_weighs_on_both_sides():
    a, b = Side("a", lambda p: None), Side("b", lambda p: None)  # type: ignore[arg-type,return-value]
    orders = [[s.name for s in round_order((a, b), rnd)] for rnd in range(4)]
    assert orders == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert [s.name for s in round_order((b, a), 1)] == ["a", "b"]


@pytest.mark.parametrize("opts", [BenchOptions(), BenchOptions.quick_mode()], ids=["full", "quick"])
def test_runs_are_short_and_rounds_even(opts):
    """A run of a few waves of requests (~1-2 s: the machine's speed drifts over longer ones), an even number of rounds
    so each server runs first as often as second."""
    assert opts.rounds % 2 == 0
    for c in opts.concurrencies:
        assert 2 * c <= opts.num_prompts(c) <= 4 * c


def test_api_cpu_is_sampled_around_the_requests_not_the_client_s_metrics_scrapes():
    import asyncio
    import inspect

    from vllm.benchmarks import serve

    # The anchor: vLLM's client fetches these counters once right before its requests and once right after.
    body = inspect.getsource(serve.benchmark)
    assert body.count("await fetch_spec_decode_metrics(") == 2
    assert body.count("await fetch_diffusion_metrics(") == 2
    before = serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics
    readings = iter([1.25, 1.5])
    with requests_window(lambda: next(readings)) as marks:
        assert asyncio.run(serve.fetch_spec_decode_metrics("http://unused", None)) is None
        assert asyncio.run(serve.fetch_diffusion_metrics("http://unused", None)) is None
        assert asyncio.run(serve.fetch_spec_decode_metrics("http://unused", None)) is None
    assert marks == [1.25, 1.5]
    assert (serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics) == before
