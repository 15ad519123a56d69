"""Where the service's ggml kernels hand a batch over to torch's GEMM: per ggml block type, the row count from which
the op dequantizes its blocks and runs the activation dtype's GEMM instead of ggml's own matmul (0: never).

ggml's matmul reads the blocks once per call and wins at decode; the GEMM wins once enough rows share the dequantized
weights. Where it takes over depends on the GEMM the CPU runs for the engine's dtype: AMX's bf16 tiles take over from
32-64 rows, and from 128-256 even for the K-quants, whose matmul Zen 4's AVX-512 BF16 GEMM never beat up to 512 rows;
an fp32 GEMM needs 64-512. So each backend names, per activation dtype, the table measured on the GEMM closest to its
own (backends.py), and the policy hands them to every vLLM process in HANDOVER_ENV where a ggml kernel runs.

Each table: `python -m bench.ggml_prefill --type T [--dtype float32]` (one thread, the bench model's four fused
shapes, rows 1, 8, 16, ..., 512), the first row count where dequantize + GEMM ran faster (docs/quantization.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from service.policy.decision import PolicyResult, env
from service.policy.quant_kernels import KERNELS

HANDOVER_ENV = "SERVICE_GGML_HANDOVER"
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


@dataclass(frozen=True)
class GgmlHandover:
    rows: Mapping[str, int]  # ggml type -> the first row count where the GEMM won; a type left out: never (0)
    gemm: str  # the GEMM it was measured against
    backend: str  # the service backend of the machine it was measured on
    measured: str  # machine, date, what else it showed

    def row(self, type_name: str) -> int:
        return self.rows.get(type_name, 0)


BF16_ZEN4 = GgmlHandover(
    {"Q4_0": 128, "Q4_1": 128, "Q5_0": 128, "Q5_1": 32, "Q8_0": 64},
    "AVX-512 BF16 GEMM",
    "zen",
    "AMD EPYC Zen 4 KVM guest, 2026-11-26 (Q4_1 as repacked Q4_0 plus offsets: 2026-12-01); the K-quants stayed with "
    "ggml up to 512 rows",
)
FP32_ZEN2 = GgmlHandover(
    {"Q4_0": 512, "Q4_1": 256, "Q5_0": 128, "Q5_1": 64, "Q8_0": 256},
    "AVX2 fp32 GEMM",
    "avx2",
    "AMD EPYC Zen 2 KVM guest, --dtype float32, 2026-12-02; the K-quants, which stayed with ggml in bf16 on a Zen 4, "
    "not measured",
)
BF16_AMX = GgmlHandover(
    {"Q4_0": 64, "Q4_1": 64, "Q5_0": 64, "Q5_1": 32, "Q8_0": 32, "Q2_K": 256, "Q3_K": 256, "Q4_K": 128}
    | {"Q5_K": 128, "Q6_K": 256},
    "AMX bf16 GEMM",
    "amx",
    "Intel Xeon KVM guest with AMX, 2026-12-03: at 512 rows the GEMM ran x4.7 (Q4_0), x7.0 (Q8_0) and x2.2-2.9 "
    "(K-quants) as fast as ggml",
)
BF16_AVX512 = GgmlHandover(
    {"Q5_0": 256, "Q5_1": 64, "Q8_0": 512},
    "AVX-512 BF16 GEMM (no AMX)",
    "avx512",
    "the Intel Xeon AMX guest with oneDNN held to AVX-512 BF16 (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16: what it runs on "
    "these CPUs' guests that hide AMX), 2026-12-03: Q4_0 x0.78, Q4_1 x0.93 and the K-quants x0.45-0.50 of the GEMM "
    "path's time at 512 rows",
)
FP32_AVX512 = GgmlHandover(
    {"Q4_0": 256, "Q4_1": 256, "Q5_0": 256, "Q5_1": 64, "Q8_0": 128},
    "AVX-512 fp32 GEMM",
    "amx",
    "Intel Xeon KVM guest with AMX, --dtype float32, 2026-12-03; the K-quants stayed with ggml up to 512 rows",
)


# The service's kernels that run the ggml op (their vLLM class names, as KERNELS_ENV lists them)
GGML_CLASSES = frozenset(KERNELS[k].vllm_class for k in ("ggml-q4_0", "ggml-q4_1", "ggml-q8_0", "ggml-gguf"))


# A bf16 engine on a CPU without native bf16 (no AVX-512 BF16 or AMX: the avx512 backend's Intel guests without the
# extension, a bf16 engine the user asks for on AVX2): torch's bf16 GEMM converts in software, and ggml stays ahead.
SOFTWARE_BF16 = GgmlHandover(
    {},
    "bf16 GEMM converted in software",
    "avx512",
    "the Intel Xeon AMX guest with oneDNN held to AVX-512 without its bf16 instructions (ONEDNN_MAX_CPU_ISA="
    "AVX512_CORE), 2026-12-03: ggml's matmul ran x1.05-20 as fast as dequantize + that GEMM at every row count up to "
    "512 (Q4_0, Q4_1, Q5_1, Q8_0); on an Emerald Rapids guest without AVX-512 BF16 ggml's int4 kernel prefilled 30 "
    "tok/s through it, 2026-11-26",
)


def handover_env(tables: Mapping[str, Mapping[str, int]]) -> str:
    """activation dtype -> ggml type -> rows, as HANDOVER_ENV carries it."""
    return json.dumps({d: dict(rows) for d, rows in tables.items()}, sort_keys=True, separators=(",", ":"))


def parse_handover(value: str) -> dict[str, dict[str, int]]:
    return {str(d): {str(t): int(n) for t, n in rows.items()} for d, rows in json.loads(value).items()}


def describe(table: GgmlHandover) -> str:
    if not table.rows:
        return "no type, ggml's matmul at every row count"
    by_rows = ", ".join(f"{t} from {n} rows" for t, n in table.rows.items())
    never = [t for t in K_QUANTS if t not in table.rows]
    return by_rows + (f"; {', '.join(never)} never" if never else "")


def tables_for(tables: Mapping[str, GgmlHandover], native_bf16: bool) -> dict[str, GgmlHandover]:
    """A backend's tables on a CPU: without native bf16 the bf16 table is SOFTWARE_BF16's, whatever the backend."""
    return {**tables, "bfloat16": SOFTWARE_BF16} if not native_bf16 else dict(tables)


def plan_handover(
    backend: str, tables: Mapping[str, GgmlHandover], dtype: str, native_bf16: bool, planned_kernels: str
) -> PolicyResult:
    """The backend's tables on this CPU (tables_for; fp16 takes bf16's), where a ggml kernel runs
    (`planned_kernels`: KERNELS_ENV's value). The reason gives the engine dtype's table and where it was measured."""
    if not GGML_CLASSES & set(planned_kernels.split(",")):
        return PolicyResult()
    tables = tables_for(tables, native_bf16)
    table = tables.get(dtype) or tables["bfloat16"]
    why = (
        f"{dtype} activations: ggml's matmul below these rows, dequantize + the {table.gemm} from them: "
        f"{describe(table)}. Measured ({table.measured}; python -m bench.ggml_prefill, the first row count where the "
        "GEMM ran faster)"
    )
    if table.backend != backend:
        why += f"; not measured on {backend}: the {table.backend} machine's {table.gemm} is the nearest measured"
    value = handover_env({d: t.rows for d, t in tables.items()})
    return PolicyResult.of(env(HANDOVER_ENV, value, why, "policy"))
