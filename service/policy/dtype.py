"""The model dtype: bf16 where the CPU computes it natively, elsewhere what `make bench` measured on that class of
CPU (bf16 against fp32 decode, and prefill where decode is level, side by side: bench/dtype.py), when fp32's weights
fit and, where the measurement's fp32 ran on bf16 weights, when this model's are kept so."""

from __future__ import annotations

from dataclasses import dataclass

from service.facts.cpu import Isa
from service.policy.backends import Backend
from service.policy.decision import PolicyResult, engine

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def isa_class(isa: Isa, backend: Backend) -> str:
    """How the CPU computes bf16, which is what the dtype choice keys on: natively, or as the backend's kernel
    build does without it (the registry's dtype class: _C_AVX512 or _C_AVX2)."""
    return "native-bf16" if isa.native_bf16 else backend.dtype_class


@dataclass(frozen=True)
class Ratio:
    """bf16/fp32 with its 95% interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"x{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"


@dataclass(frozen=True)
class Measurement:
    """bf16/fp32 batch-1 rates on one CPU of a class: decode (ratio, low, high of its 95% interval), prefill too."""

    cpu: str
    ratio: float
    low: float
    high: float
    source: str  # the command and the run it comes from
    prefill: Ratio | None = None
    # fp32's linear weights in the run: "fp32", or "bf16" (kept for the service's kernel, dense_kernel.py), in which
    # case the measurement speaks only for models an fp32 engine keeps in bf16 here
    fp32_weights: str = "fp32"

    def fp32_faster(self) -> bool:
        """fp32 decodes faster, or decodes level (interval across 1) and prefills faster."""
        level = self.low <= 1 <= self.high
        return self.high < 1 or (level and self.prefill is not None and self.prefill.high < 1)

    def __str__(self) -> str:
        prefill = f", prefill {self.prefill}" if self.prefill else ""
        weights = " (fp32 on bf16 weights)" if self.fp32_weights == "bf16" else ""
        return (
            f"bf16/fp32{weights} decode x{self.ratio:.2f} [{self.low:.2f}, {self.high:.2f}]{prefill} on {self.cpu} "
            f"({self.source})"
        )


# One entry per dtype class of the backend registry, from `python -m bench.dtype` (or `python -m bench --dtype`).
MEASUREMENTS: dict[str, Measurement] = {
    # bf16 runs torch's reference GEMM there (oneDNN refuses a bf16 matmul without AVX-512), fp32 oneDNN's.
    "avx2": Measurement(
        "an AMD EPYC Zen 1 KVM guest",
        0.900,
        0.836,
        0.969,
        "python -m bench.dtype --repetitions 3 --requests 3 --max-tokens 32, 2026-11-24",
        prefill=Ratio(0.16, 0.15, 0.16),
    ),
    # AVX-512 without its bf16 extension (vLLM's _C_AVX512): bf16 GEMMs convert in software, fp32 ones are native.
    "avx512": Measurement(
        "an Intel Xeon Emerald Rapids KVM guest without AMX or AVX-512 BF16",
        1.015,
        0.901,
        1.142,
        "python -m bench.dtype --repetitions 3, 2026-11-26 22:41",
        prefill=Ratio(0.229, 0.135, 0.389),
        fp32_weights="bf16",
    ),
}


# The packaged default model (SmolLM2-135M-Instruct, a Q4_1 GGUF) is there to answer right out of the box. In fp32
# its dequantized weights are exact and it answers; in bf16 the rounding decides near-ties of its first token.
DEFAULT_MODEL_FP32 = (
    "the default model is served in fp32 for its answers: its dequantized Q4_1 weights are exact in fp32, and its "
    "top two first tokens for 'What is the capital of France?' are 0.10 nat apart in transformers' fp32 forward, "
    'inside bf16\'s rounding (bf16 answered "L\'Étoile...", fp32 "The capital of France is Paris." on an AMD '
    "EPYC Zen 4 guest, zentorch); bf16 decoded it 1.7x faster there (45.6 vs 27.3 tok/s, 6 alternating runs): "
    "set dtype bfloat16 for speed"
)


def choose_dtype(
    isa: Isa,
    backend: Backend,
    requested: str,
    declared: str | None,
    fp32_blocked: str | None = None,
    default_model: bool = False,
    fp32_bf16_weights: bool = False,
) -> PolicyResult:
    """The `dtype` engine argument. `fp32_blocked`: why this model cannot run in fp32 here (its kernels, the memory
    limit), if it cannot; `default_model`: the packaged default model (fp32 for its answers, DEFAULT_MODEL_FP32);
    `fp32_bf16_weights`: an fp32 engine would keep this model's linear weights in bf16 here (dense_kernel.py)."""
    kernels = backend.kernels
    if requested != "auto" and requested not in kernels.dtypes:
        warning = f"{requested} requested, but the {backend.name} backend's kernels compute {'/'.join(sorted(kernels.dtypes))} only ({kernels.dtype_source}): running bfloat16 instead"
        return PolicyResult.of(engine("dtype", "bfloat16", warning, "policy"), warnings=[warning])
    if requested != "auto":
        emulated = requested == "bfloat16" and not isa.native_bf16
        warning = "bfloat16 requested on a CPU without native bf16 (no AVX-512 BF16 / AMX): emulated"
        return PolicyResult.of(
            engine("dtype", requested, "set by the user", "user"), warnings=[warning] if emulated else []
        )
    declares = f"; the model declares {declared}" if declared else ""
    if default_model and fp32_blocked is None:
        return _policy("float32", DEFAULT_MODEL_FP32)
    if isa.native_bf16:
        unit = "AMX" if isa.amx_bf16 else "AVX-512 BF16"
        return _policy("bfloat16", f"the CPU computes bf16 natively ({unit}){declares}")
    cls = isa_class(isa, backend)
    measured = MEASUREMENTS.get(cls)
    if measured is not None and measured.fp32_weights == "bf16" and not fp32_bf16_weights:
        return _policy(
            "bfloat16",
            f"no native bf16 on this CPU ({cls}); fp32 was measured on bf16 weights ({measured}), which an fp32 engine "
            "does not keep for this model here (engine.linear_weights): bf16 halves the bytes a decode reads"
            f"{declares}",
        )
    if measured is None:
        return _policy(
            "bfloat16",
            f"no native bf16 on this CPU ({cls}), and no CPU of that class measured yet (bench/dtype.py): bf16 "
            f"halves the bytes a bandwidth-bound decode reads{declares}",
        )
    if measured.fp32_faster():
        if fp32_blocked is None:
            return _policy("float32", f"no native bf16 on this CPU ({cls}): {measured}{declares}")
        return _policy(
            "bfloat16",
            f"no native bf16 on this CPU ({cls}): fp32 is faster ({measured}), but {fp32_blocked}{declares}",
        )
    verdict = "faster" if measured.low > 1 else "not resolved from fp32, and half the bytes"
    return _policy("bfloat16", f"no native bf16 on this CPU ({cls}): bf16 {verdict} ({measured}){declares}")


def _policy(dtype: str, reason: str) -> PolicyResult:
    return PolicyResult.of(engine("dtype", dtype, reason, "policy"))
