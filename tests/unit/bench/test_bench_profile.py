"""bench/profile.py: py-spy summaries of the API and engine processes."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from bench import profile


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
    areas = dict(profile.summarize(folded, areas=profile.DECODE_STEP)["by_area"])
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
    areas = dict(profile.summarize(folded, areas=profile.DECODE_STEP)["by_area"])
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
    s = profile.summarize(folded, areas=profile.DECODE_STEP, threads_with=profile.COMPUTE_THREADS)
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


def test_the_lm_head_is_its_own_area_whatever_gemm_runs_it_and_a_step_line_gives_milliseconds():
    # As py-spy records SmolLM2's bf16 decode step on a GGUF file's blocks (Zen 4): the tied LM head runs on ZenDNN.
    step = "execute_model (/x/site-packages/vllm/v1/worker/gpu_model_runner.py:2)"
    zen = "amdzen::gen::jitAmdZenBF16::executeKernel (zentorch/libzentorch.so)"
    folded = "\n".join(
        [
            f"{step};Runner.call (torch/_inductor/output_code.py:1);linear (libservice_ggml.so);ggml_vec_dot_q4_1_q8_1 (libggml-cpu.so) 50",
            f"{step};compute_logits (/x/site-packages/vllm/model_executor/models/llama.py:3);{zen} 25",
            f"{step};Runner.call (torch/_inductor/output_code.py:1);{zen} 5",
            f"{step};dequeue (/x/site-packages/vllm/distributed/device_communicators/shm_broadcast.py:9) 20",
        ]
    )
    s = profile.summarize(folded, areas=profile.DECODE_STEP)
    assert dict(s["by_area"]) == {
        "linear layers (ggml: the service's kernels)": 0.5,
        "LM head (logits over the vocabulary)": 0.25,
        "engine-core <-> worker hand-off (shared-memory queue)": 0.2,
        "linear layers (ZenDNN JIT GEMM kernels, zentorch)": 0.05,
    }
    assert profile.step_line(s, 20.0).startswith(
        "linear layers (ggml: the service's kernels) 50% (10.0 ms), LM head (logits over the vocabulary) 25% (5.0 ms)"
    )
    assert "ms" not in profile.step_line(s)


def test_in_a_run_on_ggml_unnamed_code_under_a_torch_op_call_is_ggml_and_dispatch_is_named():
    graph = "execute_model (/x/vllm/v1/worker/gpu_model_runner.py:2);Runner.call (/tmp/cx2e.py:1676)"
    op = "OpOverload.__call__ (torch/_ops.py:875)"
    folded = [
        f"{graph};{op};linear (libservice_ggml.so);ggml_vec_dot_q4_1_q8_1 (libggml-cpu.so) 40",
        f"{graph};{op};0x7fb77c5785b4 (?) 30",  # the unwinder lost ggml's frames
        f"{graph};{op};torch::jit::invokeOperatorFromPython (libtorch_python.so) 20",
        f"{graph};{op};linear (libservice_ggml.so);at::native::AVX2::reduced_float_copy_kernel (libtorch_cpu.so) 10",
    ]
    areas = dict(profile.summarize("\n".join(folded), areas=profile.DECODE_STEP)["by_area"])
    assert areas == {
        "linear layers (ggml: the service's kernels)": 0.7,
        "torch op calls from Python (dispatch, argument wrapping)": 0.2,
        "dtype conversions (bf16 <-> fp32 copies)": 0.1,
    }
    # Without ggml anywhere in the run, the same unnamed code is oneDNN's JIT, as before.
    alone = dict(profile.summarize(folded[1], areas=profile.DECODE_STEP)["by_area"])
    assert alone == {"linear layers (oneDNN JIT GEMM kernels)": 1.0}


def test_frames_in_libraries_loaded_from_memory_are_named_by_their_file_and_jit_code_stays_unnamed():
    """The service loads ggml from a memfd, whose frames py-spy leaves as "0x... (?)" like JIT code; the recorded
    process's mappings name them, and the step's time goes to ggml, not to a JIT GEMM."""
    maps = [(0x1000, 0x2000, "libggml-cpu.so"), (0x3000, 0x4000, "")]
    graph = "execute_model (/x/vllm/v1/worker/gpu_model_runner.py:2);Runner.call (/tmp/cx2e.py:1676)"
    op = f"{graph};OpOverload.__call__ (torch/_ops.py:875)"
    folded = f"{op};0x7 (?);0x1500 (?) 60\n{graph};0x3500 (?) 30\n{graph};0x5000 (?) 10"
    named = profile.name_unnamed(folded, maps)
    assert named.splitlines() == [
        f"{op};0x7 (?);0x1500 (libggml-cpu.so) 60",
        f"{graph};0x3500 (?) 30",
        f"{graph};0x5000 (?) 10",
    ]
    areas = dict(profile.summarize(named, areas=profile.DECODE_STEP)["by_area"])
    assert areas == {"linear layers (ggml: the service's kernels)": 0.6, "linear layers (oneDNN JIT GEMM kernels)": 0.4}
    # Unnamed, the same samples passed for JIT code whole.
    assert dict(profile.summarize(folded, areas=profile.DECODE_STEP)["by_area"]) == {
        "linear layers (oneDNN JIT GEMM kernels)": 1.0
    }


def test_the_code_mappings_of_a_live_process_name_its_libraries():
    import os

    maps = profile.code_mappings(os.getpid())
    assert maps and all(start < end for start, end, _ in maps)
    assert any(name.startswith(("libpython", "python")) for _, _, name in maps)
    assert all("/" not in name and not name.startswith("memfd:") for _, _, name in maps)
