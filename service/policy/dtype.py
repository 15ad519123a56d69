"""The model dtype: bf16 where the CPU computes it natively, the measured choice elsewhere."""
from __future__ import annotations

from dataclasses import dataclass

from service.facts.cpu import Isa

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# CPUs with AVX-512 or AVX2 but no native bf16: the dtype `make bench` (decode against the memory-bandwidth
# ceiling, bf16 vs fp32 on the same model) measured faster. See README "Benchmarks".
MEASURED_WITHOUT_NATIVE_BF16 = "bfloat16"
MEASUREMENT = "bench: bf16 vs fp32 batch-1 decode on a bandwidth-bound model (bench/results)"


@dataclass(frozen=True)
class DtypeChoice:
    value: str
    reason: str
    source: str
    warning: str | None = None


def choose_dtype(isa: Isa, backend: str, requested: str, declared: str | None) -> DtypeChoice:
    if requested == "float16" and backend == "zen":
        warning = "float16 requested, but zentorch computes only bf16/fp32 on Zen: running bfloat16 instead"
        return DtypeChoice("bfloat16", warning, "policy", warning)
    if requested != "auto":
        warning = None
        if requested == "bfloat16" and not isa.native_bf16:
            warning = "bfloat16 requested on a CPU without native bf16 (no AVX-512 BF16 / AMX): emulated"
        return DtypeChoice(requested, "set by the user", "user", warning)
    if isa.native_bf16:
        unit = "AMX" if isa.amx_bf16 else "AVX-512 BF16"
        return DtypeChoice("bfloat16", f"the CPU computes bf16 natively ({unit})", "policy")
    return DtypeChoice(
        MEASURED_WITHOUT_NATIVE_BF16,
        f"no native bf16 on this CPU; {MEASURED_WITHOUT_NATIVE_BF16} measured faster ({MEASUREMENT})"
        + (f"; the model declares {declared}" if declared else ""),
        "policy",
    )
