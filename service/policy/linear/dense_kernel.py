"""The unquantized linear layers on a CPU without native bf16: in an fp32 engine, vLLM's fp32 GEMM or the service's
kernel on weights kept in bf16; in a bf16 engine, vLLM's bf16 GEMM (bf16 converted in software) or the service's
kernel (service/kernels/bf16_linear.py). Per backend default (service/policy/machine/backends.py, with the measurement it
rests on) or the user's bf16_weights. In an fp32 engine only layers whose values are bf16 are kept so (checked at
load), so the choice changes speed and memory, not results."""

from __future__ import annotations

from service.facts.quantization import QuantFacts
from service.facts.software import KERNELS_NOT_BUILT
from service.in_vllm.contract import KERNELS_ENV
from service.kernels.registry import KERNELS
from service.measurements.store import cite
from service.policy.machine.backends import Backend
from service.policy.plan.decision import PolicyResult, Source, env, record
from service.settings import Settings

KERNEL = KERNELS["bf16-weights"]
# Where a backend keeps fp32 weights by default, what the other choice measured.
MEASURED = cite("claim/bf16-weights-engine/zen4")


# The bf16 engine's two choices on a CPU without native bf16: the weights are bf16 either way, the kernel differs.
VLLM_BF16, OURS_BF16 = "bf16, vLLM's GEMM", "bf16, the service's kernel"
# An fp32 engine's linear weights that are bf16 values, kept bf16 by the service's kernel.
FP32_ENGINE_BF16 = "bf16"


def plan_dense_kernel(
    quant: QuantFacts | None,
    declared_dtype: str | None,  # the checkpoint's torch_dtype (a GGUF file's converted copy: float32)
    backend: Backend,
    dtype: str,
    native_bf16: bool,  # the CPU computes bf16 (AVX-512 BF16, AMX): vLLM's bf16 GEMMs are native there
    settings: Settings,
    user: frozenset[str],
    kernels_built: str | None,  # what the service's kernel library was built from, if it is built
    gguf_blocks: str | None = None,  # the types a GGUF file's linear layers keep (model.gguf_blocks)
) -> PolicyResult:
    if quant is not None:
        return PolicyResult()
    asked = settings.bf16_weights if "bf16_weights" in user else "auto"
    if gguf_blocks:  # in either engine dtype, no dense linear layer is left to keep in bf16 or fp32
        why = f"the GGUF file's {gguf_blocks} blocks on ggml's kernel (model.gguf_blocks)"
        if asked != "auto":
            why += f"; bf16_weights={asked} applies to dense weights and has nothing to change here"
        return PolicyResult.of(record("engine", "linear_weights", f"gguf {gguf_blocks}", why, "policy"))
    if dtype == "bfloat16" and not native_bf16:
        return _bf16_engine(backend, asked, kernels_built)
    if dtype != "float32":
        return PolicyResult()
    if asked == "off":
        return PolicyResult.of(record("engine", "linear_weights", "fp32", "set by the user (bf16_weights=off)", "user"))
    if asked == "auto" and not backend.bf16_weights:
        why = (
            f"vLLM's fp32 GEMM, the {backend.name} backend's default; bf16_weights=on keeps weights that are bf16 "
            f"values in bf16 for the service's kernel ({MEASURED})"
        )
        return PolicyResult.of(record("engine", "linear_weights", "fp32", why, "default"))
    if asked == "auto" and declared_dtype != "bfloat16":
        why = f"the checkpoint's weights are {declared_dtype or 'of an undeclared dtype'}, not bf16 values to keep"
        return PolicyResult.of(record("engine", "linear_weights", "fp32", why, "policy"))
    why = "set by the user (bf16_weights=on)" if asked == "on" else backend.bf16_weights
    return _service_kernel(
        (FP32_ENGINE_BF16, "fp32"),
        why,
        asked,
        kernels_built,
        "; layers whose values are not bf16 keep vLLM's fp32 GEMM",
    )


def _bf16_engine(backend: Backend, asked: str, kernels_built: str | None) -> PolicyResult:
    if asked == "off":
        return PolicyResult.of(
            record("engine", "linear_weights", VLLM_BF16, "set by the user (bf16_weights=off)", "user")
        )
    if asked == "auto" and not backend.bf16_engine:
        why = (
            f"no native bf16 on this CPU: vLLM's bf16 GEMM converts it in software, the {backend.name} backend's "
            "default; bf16_weights=on runs the service's kernel (fp32 arithmetic on the bf16 weights)"
        )
        return PolicyResult.of(record("engine", "linear_weights", VLLM_BF16, why, "default"))
    why = "set by the user (bf16_weights=on)" if asked == "on" else backend.bf16_engine
    return _service_kernel((OURS_BF16, VLLM_BF16), why, asked, kernels_built, "")


def _service_kernel(
    values: tuple[str, str],  # the decision's value with the service's kernel, and without it
    why: str,
    asked: str,
    kernels_built: str | None,
    also: str,  # said after the reason when the kernel runs
) -> PolicyResult:
    source: Source = "user" if asked == "on" else "policy"
    if not kernels_built:
        missing = KERNELS_NOT_BUILT
        if asked == "on":
            return PolicyResult(errors=(f"bf16_weights=on was set, but {missing}",))
        return PolicyResult.of(record("engine", "linear_weights", values[1], f"{why}; but {missing}", "policy"))
    return PolicyResult.of(
        record("engine", "linear_weights", values[0], f"{why}{also} ({kernels_built})", source),
        env(KERNELS_ENV, KERNEL.vllm_class, f"{KERNEL.op}; the service's vLLM plugin registers it", source),
    )
