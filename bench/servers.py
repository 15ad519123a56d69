"""The servers under test, each a harness.ServerProcess: our service, vLLM's own OpenAI server with the engine
arguments and environment our running service reports (GET /v1/hardware) or with vLLM's defaults, and llama.cpp's
llama-server (the peer of bench/parts/peer.py and bench/parts/speculative.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness import ServerProcess, offline_env, python_module
from service.facts.cpulist import parse_cpulist
from service.policy.linear.dense_kernel import FP32_ENGINE_BF16, OURS_BF16
from service.server.supervision.engine_start import engine_flags

VLLM_SERVER = "vllm.entrypoints.openai.api_server"
# llama.cpp's tools (`make bench-tools`); BENCH_LLAMA_CPP_BUILD: a build with other flags (e.g. AVX2 alone, for the
# AVX2 emulation: docs/development.md).
LLAMA_CPP_BIN = (
    Path(os.environ.get("BENCH_LLAMA_CPP_BUILD") or Path(__file__).resolve().parents[1] / ".cache/llama.cpp-build")
    / "bin"
)


def llama_cpp_flags() -> str:
    """The compiler flags the llama.cpp build was given beyond its CMake options (CMAKE_C_FLAGS in its CMakeCache),
    "" for none: a build without its AMX kernels (-mno-amx-*) is another peer than the default one."""
    cache = LLAMA_CPP_BIN.parent / "CMakeCache.txt"
    lines = cache.read_text().splitlines() if cache.exists() else []
    return next((line.split("=", 1)[1].strip() for line in lines if line.startswith("CMAKE_C_FLAGS:")), "")


SERVED = "bench-llama"  # llama-server's model name
CTX_PER_SLOT = 512  # prompt + answer of every workload here, with room
# Given to both sides (the service does not report it): admitted requests, far above any concurrency measured.
MAX_QUEUED = 64


def bench_env() -> dict[str, str]:
    """Offline, CPU, and nothing the policy sets: each server gets exactly what its side decides."""
    return offline_env(drop=("SERVICE_", "VLLM_CPU_", "OMP_", "KMP_", "GOMP_"))


@dataclass(frozen=True)
class Reported:
    """What a running service reports at GET /v1/hardware (its startup report), as the bench uses it."""

    raw: dict[str, Any]

    @classmethod
    def fetch(cls, url: str) -> Reported:
        resp = httpx.get(url + "/v1/hardware", timeout=10)
        resp.raise_for_status()
        return cls(resp.json())

    @property
    def engine_args(self) -> dict[str, Any]:
        """The engine arguments the service passes to vLLM (its report exports them)."""
        return dict(self.raw["engine_args"])

    @property
    def env(self) -> dict[str, str]:
        """The environment the service sets before vLLM starts."""
        return dict(self.raw["env"])

    @property
    def engine_cpus(self) -> list[int]:
        return sorted(c for rank in self.raw["threads"]["ranks"] for c in parse_cpulist(rank))

    @property
    def read_per_token(self) -> int | None:
        """The weight bytes one decode step reads, as the service decided them (model.read_per_token)."""
        found = next((d for d in self.raw["decisions"] if d["setting"] == "model.read_per_token"), None)
        return int(found["value"]) if found else None

    @property
    def kv_read_per_token(self) -> dict[str, int] | None:
        """{depth: KV-cache bytes one decode step reads there}, as the service planned them (model.kv_read_per_token)."""
        found = next((d for d in self.raw["decisions"] if d["setting"] == "model.kv_read_per_token"), None)
        return {str(k): int(v) for k, v in found["value"].items()} if found else None

    @property
    def linear_kernel(self) -> str:
        """The kernel the service's linear layers run, and what chose it (a calibration, the table, the user)."""
        found = {d["setting"]: d for d in self.raw["decisions"]}
        if kernel := found.get("quant.linear_kernel"):
            return f"{kernel['value']} ({kernel['source']})"
        if (blocks := found.get("model.gguf_blocks")) and blocks["value"] != "dequantized":
            return f"the GGUF file's own {blocks['value']} blocks on the service's ggml kernel ({blocks['source']})"
        dtype = found["engine.dtype"]["value"]
        if (held := found.get("engine.linear_weights")) and held["value"] in (FP32_ENGINE_BF16, OURS_BF16):
            return f"bf16 weights on the service's kernel in a {dtype} engine ({held['source']})"
        return f"the {self.raw['backend']['name']} backend's {dtype} GEMM"

    @property
    def reserved_cpus(self) -> list[int]:
        return sorted(parse_cpulist(self.raw["threads"]["reserved"] or ""))

    @property
    def allowed_cpus(self) -> list[int]:
        return list(self.raw["hardware"]["allowed_cpus"])

    def machine(self) -> dict[str, Any]:
        hw = self.raw["hardware"]
        return {
            "cpu": hw["model_name"],
            "family_model": f"{hw['family']}/{hw['model']}",
            "microarchitecture": hw["microarchitecture"],
            "isa": hw["isa"],
            "physical_cores": hw["physical_cores"],
            "logical_cpus": hw["logical_cpus"],
            "numa_nodes": hw["numa_nodes"],
            "memory_gib": round(hw["memory_limit_bytes"] / 1024**3, 1) if hw["memory_limit_bytes"] else None,
            "engine_cpus": self.engine_cpus,
            "reserved_cpus": self.reserved_cpus,
            "backend": self.raw["backend"]["name"],
            "software": self.raw["software"],
        }


def ours(
    model: str, served: str, log_path: Path, settings_env: dict[str, str] | None = None, name: str = "ours"
) -> ServerProcess:
    """`python -m service serve`: the startup policy runs inside it, as in production."""
    env = bench_env()
    env.update(settings_env or {})
    env.update(SERVICE_MODEL=model, SERVICE_SERVED_MODEL_NAME=served, SERVICE_MAX_QUEUED_REQUESTS=str(MAX_QUEUED))
    return ServerProcess(env, log_path, name=name)


def vllm_argv(model: str, served: str, engine_args: dict[str, Any], max_queued: int | None = MAX_QUEUED) -> list[str]:
    """vLLM's own server with the given engine arguments: the one place this argv is written."""
    argv = python_module(
        VLLM_SERVER, "--model", model, "--served-model-name", served, "--host", "127.0.0.1", "--port", "{port}"
    )
    argv += engine_flags(engine_args)
    return argv + (["--max-num-queued-reqs", str(max_queued)] if max_queued else [])


def vllm_same_engine(model: str, served: str, reported: Reported, log_path: Path) -> ServerProcess:
    """vLLM's own server with the engine arguments and environment the service reported deciding."""
    env = bench_env()
    env.update(reported.env)
    return ServerProcess(env, log_path, vllm_argv(model, served, reported.engine_args), "/v1/models", "vllm")


def vllm_defaults(model: str, served: str, kv_cache_bytes: int | None, log_path: Path) -> ServerProcess:
    """vLLM's own server with its defaults, except the KV-cache size: vLLM's default claims 92% of the
    machine's memory (--gpu-memory-utilization 0.92), which refuses to start, or starves every other
    process, on a shared machine. It gets the same KV size as the policy chose."""
    args = {"kv_cache_memory_bytes": kv_cache_bytes} if kv_cache_bytes else {}
    return ServerProcess(bench_env(), log_path, vllm_argv(model, served, args, None), "/v1/models", "vllm-defaults")


def llama_server(
    gguf: Path,
    cpus: list[int],
    slots: int,
    log_path: Path,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
    ctx_per_slot: int = CTX_PER_SLOT,
) -> ServerProcess:
    """llama-server with the engine's compute cores as its threads (pinned there, strictly), `slots` parallel slots
    (continuous batching is its default), a context of `ctx_per_slot` per slot; `extra`: more of its options."""
    mask = hex(sum(1 << c for c in cpus))
    argv = [
        str(LLAMA_CPP_BIN / "llama-server"),
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "-a",
        SERVED,
        "-np",
        str(slots),
        "-c",
        str(ctx_per_slot * slots),
        "-t",
        str(len(cpus)),
        "-tb",
        str(len(cpus)),
        "-C",
        mask,
        "--cpu-strict",
        "1",
        "-Cb",
        mask,
        "--cpu-strict-batch",
        "1",
        "--no-webui",
        # No SSE keep-alive comments: a request that waits 30 s for its first token (16 slots on one thread) got a
        # ":" ping before any data, which vLLM's benchmark client strips of its blank line and then reads every
        # later event as part of that comment ("Never received a valid chunk"): cells left out at c=16.
        "--sse-ping-interval",
        "-1",
        "--metrics",  # its own count of generated tokens, which the bench's client cannot read (predicted_tokens)
    ]
    return ServerProcess(bench_env() | (env or {}), log_path, argv, "/health", "llama.cpp")
