"""The unquantized linear layers of a model the engine computes in fp32: vLLM's fp32 GEMM, or the service's kernel on
weights kept in bf16 (service/kernels/bf16_linear.py), per backend default (service/policy/backends.py, with the
measurement it rests on) or the user's bf16_weights. Only layers whose values are bf16 are kept so (checked at load),
so the choice changes speed and memory, not results."""

from __future__ import annotations

from service.facts.quantization import QuantFacts
from service.policy.backends import Backend
from service.policy.decision import PolicyResult, Source, env, record
from service.policy.quant_kernels import KERNELS, KERNELS_ENV
from service.settings import Settings

KERNEL = KERNELS["bf16-weights"]


def plan_dense_kernel(
    quant: QuantFacts | None,
    backend: Backend,
    dtype: str,
    settings: Settings,
    user: frozenset[str],
    kernels_built: str | None,  # what the service's kernel library was built from, if it is built
) -> PolicyResult:
    if quant is not None or dtype != "float32":
        return PolicyResult()
    asked = settings.bf16_weights if "bf16_weights" in user else "auto"
    if asked == "off":
        return PolicyResult.of(record("engine", "linear_weights", "fp32", "set by the user (bf16_weights=off)", "user"))
    if asked == "auto" and not backend.bf16_weights:
        why = f"fp32: vLLM's fp32 GEMM ({backend.name} keeps it by default; bf16_weights=on for the service's kernel)"
        return PolicyResult.of(record("engine", "linear_weights", "fp32", why, "default"))
    source: Source = "user" if asked == "on" else "policy"
    why = "set by the user (bf16_weights=on)" if asked == "on" else backend.bf16_weights
    if not kernels_built:
        missing = "the service's kernels are not built (make kernels)"
        if asked == "on":
            return PolicyResult(errors=(f"bf16_weights=on was set, but {missing}",))
        return PolicyResult.of(record("engine", "linear_weights", "fp32", f"{why}; but {missing}", "policy"))
    why += f"; layers whose values are not bf16 keep vLLM's fp32 GEMM ({kernels_built})"
    return PolicyResult.of(
        record("engine", "linear_weights", "bf16", why, source),
        env(KERNELS_ENV, KERNEL.vllm_class, f"{KERNEL.op}; the service's vLLM plugin registers it", source),
    )
