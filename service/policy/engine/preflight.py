"""Pre-flight: can vLLM's CPU kernels run this model on this backend in this dtype? Checked before loading.

A model outside a kernel's limits otherwise loads and then kills the engine on its first request (a Qwen3-Next
whose linear_key_head_dim 64 differs from linear_value_head_dim 128: `chunk_gated_delta_rule_cpu: expect head_dim
to be equal to head_dim_v`). No other CPU path runs such a model in vLLM 0.32, so it is refused with the limit
and the model's values.
"""

from __future__ import annotations

from service.facts.cpu import Isa
from service.facts.model import ModelFacts
from service.facts.vllm_kernel_limits import BackendKernels
from service.policy.machine.backends import Backend
from service.policy.plan.decision import PolicyResult, record


def check_kernels(model: ModelFacts, backend: Backend, dtype: str, isa: Isa) -> PolicyResult:
    checked: list[str] = []
    errors: list[str] = []
    for check in (_dtype, _attention, _gdn):
        ok, problems = check(model, backend.name, dtype, isa, backend.kernels)
        checked.extend(ok)
        errors.extend(problems)
    if errors:
        return PolicyResult(errors=tuple(errors))
    return PolicyResult.of(record("preflight", "kernels", "pass", "; ".join(checked), "policy"))


def dtype_limit(model: ModelFacts, backend: Backend, dtype: str) -> str | None:
    """Why vLLM's CPU kernels cannot run this model in `dtype` on this backend, if they cannot."""
    k = backend.kernels
    if dtype not in k.dtypes:
        return f"the {backend.name} backend's kernels compute {'/'.join(sorted(k.dtypes))} only ({k.dtype_source})"
    if model.has_linear_attention and dtype not in k.gdn.dtypes:
        return f"vLLM's CPU Gated-DeltaNet prefill kernel runs {'/'.join(sorted(k.gdn.dtypes))} only"
    return None


def _sorted(values: frozenset[int]) -> str:
    return ", ".join(str(v) for v in sorted(values))


def _dtype(model: ModelFacts, backend: str, dtype: str, isa: Isa, k: BackendKernels) -> tuple[list[str], list[str]]:
    if dtype in k.dtypes:
        return [f"{dtype} on {backend}"], []
    return [], [f"the {backend} backend's kernels compute {'/'.join(sorted(k.dtypes))}, not {dtype} ({k.dtype_source})"]


def _attention(model: ModelFacts, backend: str, dtype: str, isa: Isa, k: BackendKernels) -> tuple[list[str], list[str]]:
    # MLA layers run on vLLM's MLA backends, pure linear-attention stacks on no attention kernel at all.
    if model.uses_mla or model.full_attention_layers == 0 or model.head_dim is None:
        return [], []
    if model.head_dim in k.attention_head_sizes:
        return [f"attention head_dim {model.head_dim} is a CPU attention size"], []
    return [], [
        f"attention head_dim {model.head_dim} is not one of the CPU attention kernel's head sizes "
        f"({_sorted(k.attention_head_sizes)}; vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes)"
    ]


def _gdn(model: ModelFacts, backend: str, dtype: str, isa: Isa, k: BackendKernels) -> tuple[list[str], list[str]]:
    key, value = model.linear_key_head_dim, model.linear_value_head_dim
    if not model.has_linear_attention or key is None or value is None:
        return [], []
    gdn, kernel = k.gdn, "vLLM's CPU Gated-DeltaNet prefill kernel chunk_gated_delta_rule_cpu"
    errors: list[str] = []
    if dtype not in gdn.dtypes:
        errors.append(
            f'{kernel} runs {"/".join(sorted(gdn.dtypes))} only, not {dtype} ("CPU GDN attention requires BF16")'
        )
    if gdn.equal_key_value_head_dims and key != value:
        errors.append(
            f'{kernel} needs linear_key_head_dim == linear_value_head_dim ("expect head_dim to be equal to '
            f'head_dim_v"); this model has linear_key_head_dim {key}, linear_value_head_dim {value}'
        )
    bad_dims = sorted({d for d in (key, value) if d not in gdn.head_dims})
    if bad_dims:
        errors.append(
            f'{kernel} is compiled for linear head dims {_sorted(gdn.head_dims)} only ("Unexpected head dim size"); '
            f"this model has linear_key_head_dim {key}, linear_value_head_dim {value}"
        )
    heads_k, heads_v = model.linear_num_key_heads, model.linear_num_value_heads
    if gdn.value_heads_multiple_of_key_heads and heads_k and heads_v and heads_v % heads_k:
        errors.append(
            f'{kernel} needs linear_num_value_heads to be a multiple of linear_num_key_heads ("expect '
            f'num_heads_kv multiple of num_heads"); this model has {heads_v} value and {heads_k} key heads'
        )
    width = model.linear_conv_kernel_dim
    if isa.avx512_bf16 and width is not None and width not in gdn.conv_kernel_dims_avx512_bf16:
        errors.append(
            f"on AVX-512 BF16 CPUs vLLM runs the GDN causal conv in C++ for linear_conv_kernel_dim "
            f'{_sorted(gdn.conv_kernel_dims_avx512_bf16)} only ("Unexpected block size"); this model has {width}'
        )
    if errors:
        return [], errors
    return [f"GDN linear heads {heads_k or '?'}x{key} key / {heads_v or '?'}x{value} value fit the CPU GDN kernels"], []
