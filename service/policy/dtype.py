"""The model dtype: bf16 where the CPU computes it natively, the measured choice elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

from service.facts.cpu import Isa
from service.policy.decision import Source

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# CPUs with AVX-512 or AVX2 but no native bf16. `make bench` decodes a bandwidth-bound model in bf16 and fp32
# side by side; on the only CPU measured so far (native bf16: AMX) bf16 ran 1.88x fp32. Batch-1 decode streams
# every weight once per token, so half the bytes keeps bf16 ahead where conversion is done in AVX-512 or AVX2
# registers too; no CPU without native bf16 has been measured yet, and the reason says so.
MEASURED_WITHOUT_NATIVE_BF16 = "bfloat16"
MEASUREMENT = (
    "decode is memory-bandwidth bound and bf16 halves the bytes per token; `make bench` measured bf16 1.88x fp32 "
    "on a native-bf16 CPU, none without it yet"
)


@dataclass(frozen=True)
class DtypeChoice:
    value: str
    reason: str
    source: Source
    warning: str | None = None


def choose_dtype(isa: Isa, backend: str, requested: str, declared: str | None) -> DtypeChoice:
    if requested == "float16" and backend == "zen":
        warning = "float16 requested, but zentorch computes only bf16/fp32 on Zen: running bfloat16 instead"
        return DtypeChoice("bfloat16", warning, "policy", warning)
    if requested != "auto":
        user_warning = None
        if requested == "bfloat16" and not isa.native_bf16:
            user_warning = "bfloat16 requested on a CPU without native bf16 (no AVX-512 BF16 / AMX): emulated"
        return DtypeChoice(requested, "set by the user", "user", user_warning)
    if isa.native_bf16:
        unit = "AMX" if isa.amx_bf16 else "AVX-512 BF16"
        return DtypeChoice("bfloat16", f"the CPU computes bf16 natively ({unit})", "policy")
    return DtypeChoice(
        MEASURED_WITHOUT_NATIVE_BF16,
        f"no native bf16 on this CPU; {MEASURED_WITHOUT_NATIVE_BF16}: {MEASUREMENT}"
        + (f"; the model declares {declared}" if declared else ""),
        "policy",
    )
