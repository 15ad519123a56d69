"""The contract between the startup (which decides) and vLLM's processes (which carry the decisions out): every
environment variable the service sets before vLLM starts, the key it adds to vLLM's additional_config, what each
holds and who reads it.

The policy writes these (service/policy, through `decision.env`, which refuses a name not listed here); inside
vLLM's processes the service's plugin and kernels read them, or vLLM itself does. This module imports nothing of
the service, so both sides can import it (pyproject.toml: `service.in_vllm` imports nothing from `service.policy`).
"""

from __future__ import annotations

from dataclasses import dataclass

# Read by the service's code inside every vLLM process (service/in_vllm, service/kernels).
PLATFORM_ENV = "SERVICE_VLLM_PLATFORM"
PLATFORM_IMPORTS_ENV = "SERVICE_VLLM_PLATFORM_IMPORTS"
FXGRAPH_PATCH_ENV = "SERVICE_TORCH_FXGRAPH_PATCH"
AOT_CACHE_PATCH_ENV = "SERVICE_VLLM_AOT_CACHE_PATCH"
AMX_STATE_ENV = "SERVICE_AMX_TILE_STATE"
LORA_ROWS_ENV = "SERVICE_LORA_ROWS_FIX"
SAMPLER_ENV = "SERVICE_REJECTION_SAMPLER"
TOP_P_ENV = "SERVICE_TOP_P"
KERNELS_ENV = "SERVICE_LINEAR_KERNELS"
HANDOVER_ENV = "SERVICE_GGML_HANDOVER"
WORKER_START_ENV = "SERVICE_WORKER_START_METHOD"
# Read by vLLM itself (vllm/envs.py and its CPU worker), by zentorch's vLLM code, or by the dynamic loader.
THREADS_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
PREPACK_ENV = "VLLM_ZENTORCH_WEIGHT_PREPACK"
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
PRELOAD_ENV = "LD_PRELOAD"

# vLLM hashes additional_config into its torch.compile cache key; the service's variables go under this key.
ADDITIONAL_CONFIG_KEY = "service"


@dataclass(frozen=True)
class Variable:
    name: str
    holds: str  # its values, as the reader parses them
    reader: str  # who reads it in vLLM's processes
    writer: str  # the policy module that decides it


VARIABLES: tuple[Variable, ...] = (
    Variable(PLATFORM_ENV, "a vLLM platform class, qualified", "service/in_vllm/plugin.py `platform`", "platform"),
    Variable(
        PLATFORM_IMPORTS_ENV,
        "modules that register the platform's ops, comma-separated (zentorch)",
        "service/in_vllm/plugin.py `platform`",
        "platform",
    ),
    Variable(FXGRAPH_PATCH_ENV, '"1" apply, "0" not', "service/in_vllm/fx_graph_cache_patch.py", "patches"),
    Variable(AOT_CACHE_PATCH_ENV, '"1" apply, "0" not', "service/in_vllm/compile_cache_patch.py", "compile_cache"),
    Variable(AMX_STATE_ENV, '"1": ask Linux for the AMX tile state', "service/in_vllm/amx_request.py", "amx_state"),
    Variable(LORA_ROWS_ENV, '"1": base-model rows out of the LoRA ops', "service/in_vllm/lora_rows.py", "lora"),
    Variable(
        SAMPLER_ENV,
        '"torch": the rejection sampler without triton',
        "service/in_vllm/rejection_sampler.py",
        "speculative",
    ),
    Variable(TOP_P_ENV, '"partial" or "sort"', "service/in_vllm/top_p.py", "top_p"),
    Variable(
        KERNELS_ENV,
        "the service's vLLM linear-kernel classes, comma-separated",
        "service/kernels/registry.py `register_kernels`",
        "quant, dense_kernel, model_source",
    ),
    Variable(
        HANDOVER_ENV,
        "JSON {dtype: {ggml type: rows}}: ggml below the rows, dequantize + GEMM from them",
        "service/kernels/ggml_linear.py",
        "ggml_handover",
    ),
    Variable(
        WORKER_START_ENV,
        '"fork": the engine core forks its workers',
        "service/in_vllm/worker_start.py",
        "worker_start",
    ),
    Variable(THREADS_BIND_ENV, "CPU lists per rank, '|'-separated", "vLLM's CPU worker", "threads"),
    Variable("VLLM_CPU_NUM_OF_RESERVED_CPU", "a count of CPUs", "vLLM's CPU platform", "threads"),
    Variable(
        "VLLM_CPU_INT4_W4A8",
        '"1" int8 activations for int4 weights, "0" weight-only',
        "vLLM's CPU int4 kernels",
        "quant",
    ),
    Variable("VLLM_DISABLED_KERNELS", "vLLM kernel class names, comma-separated", "vLLM's kernel selection", "quant"),
    Variable(PREPACK_ENV, '"1" or "0"', "zentorch's linear kernel in vLLM", "calibration_candidates"),
    Variable("VLLM_SSM_CONV_STATE_LAYOUT", '"SD"', "vLLM's CPU Gated-DeltaNet kernels", "caching"),
    Variable(CACHE_ROOT_ENV, "a directory", "vLLM's torch.compile cache", "compile_cache"),
    Variable(
        "VLLM_TARGET_DEVICE", '"" (emptied: vLLM asks the platform plugins)', "vLLM's platform resolution", "platform"
    ),
    Variable(PRELOAD_ENV, "shared libraries, ':'-separated", "the dynamic loader of each vLLM process", "preload"),
    Variable("VLLM_NO_USAGE_STATS", '"1"', "vLLM's usage reporting", "telemetry"),
    Variable("DO_NOT_TRACK", '"1"', "vLLM's usage reporting", "telemetry"),
    Variable("VLLM_MEDIA_URL_ALLOW_REDIRECTS", '"0"', "vLLM's media fetcher", "media"),
)
BY_NAME = {v.name: v for v in VARIABLES}
