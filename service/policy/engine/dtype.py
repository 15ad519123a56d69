"""The model dtype: bf16 where the CPU computes it natively, elsewhere what `make bench` measured on that class of
CPU (bf16 against fp32 decode, side by side: bench/parts/dtype.py), when fp32's weights fit."""

from __future__ import annotations

from dataclasses import dataclass

from service.facts.cpu import Isa
from service.measurements.store import cite, row
from service.policy.machine.backends import Backend
from service.policy.plan.decision import PolicyResult, engine

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def isa_class(isa: Isa, backend: Backend) -> str:
    """How the CPU computes bf16, which is what the dtype choice keys on: natively, or as the backend's kernel
    build does without it (the registry's dtype class: _C_AVX512 or _C_AVX2)."""
    return "native-bf16" if isa.native_bf16 else backend.dtype_class


@dataclass(frozen=True)
class Measurement:
    """bf16/fp32 batch-1 rates on one CPU of a class: decode (ratio, low, high of its 95% interval), prefill too."""

    cpu: str
    ratio: float
    low: float
    high: float
    source: str  # the command and the run it comes from
    prefill: str = ""  # the prefill ratio with its interval, as printed

    def __str__(self) -> str:
        prefill = f", prefill {self.prefill}" if self.prefill else ""
        return (
            f"bf16/fp32 decode x{self.ratio:.2f} [{self.low:.2f}, {self.high:.2f}]{prefill} on {self.cpu} "
            f"({self.source})"
        )


def _measured(dtype_class: str) -> Measurement:
    decode, prefill = row(f"dtype/{dtype_class}/decode"), row(f"dtype/{dtype_class}/prefill")
    assert decode.value is not None and decode.interval is not None
    return Measurement(
        decode.machine,
        decode.value,
        *decode.interval,
        f"measured: {decode.key}; {decode.command}; {decode.date}" + (f"; {decode.says}" if decode.says else ""),
        prefill=prefill.figure(),
    )


# One entry per dtype class of the backend registry, from `python -m bench.parts.dtype` (service/measurements/dtype.yaml).
MEASUREMENTS: dict[str, Measurement] = {c: _measured(c) for c in ("avx2", "avx512")}


# The packaged default model (SmolLM2-135M-Instruct, a Q4_1 GGUF) is there to answer right out of the box. In fp32
# its dequantized weights are exact and it answers; in bf16 the rounding decides near-ties of its first token.
DEFAULT_MODEL_FP32 = (
    "the default model is served in fp32 for its answers: its dequantized Q4_1 weights are exact in fp32, and "
    + cite("claim/default-model-fp32/zen4")
    + ": set dtype bfloat16 for speed"
)


def choose_dtype(
    isa: Isa,
    backend: Backend,
    requested: str,
    declared: str | None,
    fp32_blocked: str | None = None,
    default_model: bool = False,
) -> PolicyResult:
    """The `dtype` engine argument. `fp32_blocked`: why this model cannot run in fp32 here (its kernels, the memory
    limit), if it cannot; `default_model`: the packaged default model (fp32 for its answers, DEFAULT_MODEL_FP32)."""
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
    if measured is None:
        return _policy(
            "bfloat16",
            f"no native bf16 on this CPU ({cls}), and no CPU of that class measured yet (bench/parts/dtype.py): bf16 "
            f"halves the bytes a bandwidth-bound decode reads{declares}",
        )
    if measured.high < 1:
        if fp32_blocked is None:
            return _policy("float32", f"no native bf16 on this CPU ({cls}): {measured}{declares}")
        return _policy(
            "bfloat16",
            f"no native bf16 on this CPU ({cls}): fp32 decodes faster ({measured}), but {fp32_blocked}{declares}",
        )
    verdict = "faster" if measured.low > 1 else "not resolved from fp32, and half the bytes"
    return _policy("bfloat16", f"no native bf16 on this CPU ({cls}): bf16 {verdict} ({measured}){declares}")


def _policy(dtype: str, reason: str) -> PolicyResult:
    return PolicyResult.of(engine("dtype", dtype, reason, "policy"))
