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
# Where a backend keeps fp32 weights by default, what the other choice measured (docs/performance.md).
MEASURED = (
    "an fp32 engine on bf16 weights decoded x1.57 and prefilled x0.87 as fast on a Zen 4, "
    "python bench/quant_kernels.py --formats fp32"
)


def plan_dense_kernel(
    quant: QuantFacts | None,
    declared_dtype: str | None,  # the checkpoint's torch_dtype (a GGUF file's converted copy: float32)
    backend: Backend,
    dtype: str,
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
