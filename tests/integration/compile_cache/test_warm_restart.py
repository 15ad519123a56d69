"""Warm restart: the second start with torch.compile on the same cache dir loads the compiled model that the
first start saved, instead of compiling again (vLLM 0.32 needs service/in_vllm/compile_cache_patch.py for that)."""

from __future__ import annotations

import os

import pytest

from tests.support.server import ServerProcess, service_env

pytestmark = [pytest.mark.engine, pytest.mark.compile_cache, pytest.mark.timeout(3600)]

# vLLM 0.32's log lines (vllm/compilation/decorators.py).
SAVED = "saved AOT compiled function to"
LOADED = "Directly load AOT compilation from path"
RECOMPILED = "Compiling model again due to a load failure"


def start_and_stop(cache_dir, log_path, **settings: str) -> str:
    env = service_env(cache_dir, enforce_eager="false", **settings)
    env.pop("VLLM_CACHE_ROOT", None)  # the policy decides it under the cache dir
    server = ServerProcess(env, log_path, name=f"compile-cache/{log_path.stem}").start()
    try:
        server.wait_ready(timeout=1800)
    finally:
        server.stop()
        server.kill_group()
    return log_path.read_text(errors="replace")


def test_second_start_loads_the_compiled_model(tmp_path):
    cold = start_and_stop(tmp_path / "cache", tmp_path / "cold.log")
    assert SAVED in cold, cold[-4000:]
    saved = [line.split(SAVED, 1)[1].strip() for line in cold.splitlines() if SAVED in line]
    assert all(p.startswith(str(tmp_path / "cache" / "vllm")) and os.path.exists(p) for p in saved), saved

    warm = start_and_stop(tmp_path / "cache", tmp_path / "warm.log")
    assert LOADED in warm, warm[-4000:]
    assert RECOMPILED not in warm, warm[-4000:]
    assert SAVED not in warm, "a warm start saves nothing: it compiled again"


def test_a_start_with_other_linear_kernels_compiles_its_own(tmp_path):
    """The linear kernels the service's plugin registers change the compiled graph, which vLLM's cache key does not
    see by itself: a start that loaded another kernel's graph failed ('NoneType' object is not subscriptable). The
    same settings but the kernel: an fp32 engine on vLLM's fp32 GEMM, then on the service's bf16-weight kernel
    (asked for, so on every backend)."""
    plain = start_and_stop(tmp_path / "cache", tmp_path / "fp32.log", dtype="float32", bf16_weights="off")
    assert SAVED in plain and "kept bf16" not in plain, plain[-4000:]
    kept = start_and_stop(tmp_path / "cache", tmp_path / "bf16-weights.log", dtype="float32", bf16_weights="on")
    assert "kept bf16, run by the service's kernel" in kept, kept[-4000:]
    assert SAVED in kept and LOADED not in kept, kept[-4000:]
