"""Where the service's ggml kernels hand a batch over to torch's GEMM: per ggml block type, the row count from which
the op dequantizes its blocks and runs the activation dtype's GEMM instead of ggml's own matmul (0: never).

ggml's matmul reads the blocks once per call and wins at decode; the GEMM wins once enough rows share the dequantized
weights. Where it takes over depends on the GEMM the CPU runs for the engine's dtype: AMX's bf16 tiles take over from
32-64 rows, and from 128-256 even for the K-quants, whose matmul Zen 4's AVX-512 BF16 GEMM never beat up to 512 rows;
an fp32 GEMM needs 64-512. So each backend names, per activation dtype, the table measured on the GEMM closest to its
own (backends.py), and the policy hands them to every vLLM process in HANDOVER_ENV where a ggml kernel runs.

Each table: `python -m bench.tools.ggml_prefill --type T [--dtype float32]` (one thread, the bench model's four fused
shapes, rows 1, 8, 16, ..., 512), the first row count where dequantize + GEMM ran faster (docs/quantization.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.in_vllm.contract import HANDOVER_ENV
from service.kernels.registry import GGML_OP_CLASSES, handover_env
from service.measurements.store import cite, row
from service.policy.plan.decision import PolicyResult, env

K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


@dataclass(frozen=True)
class GgmlHandover:
    rows: Mapping[str, int]  # ggml type -> the first row count where the GEMM won; a type left out: never (0)
    gemm: str  # the GEMM it was measured against
    backend: str  # the service backend of the machine it was measured on
    measured: str  # the store's row, as cited: what else it showed, command, machine, date

    def row(self, type_name: str) -> int:
        return self.rows.get(type_name, 0)


def _table(key: str) -> GgmlHandover:
    r = row(key)
    return GgmlHandover(dict(r.params["rows"]), r.params["gemm"], r.params["backend"], cite(key))


# The tables, each measured on one machine (service/measurements/ggml_handover.yaml)
BF16_ZEN4 = _table("ggml-handover/zen4/bfloat16")
FP32_ZEN2 = _table("ggml-handover/zen2/float32")
BF16_AMX = _table("ggml-handover/xeon-amx/bfloat16")
BF16_AVX512 = _table("ggml-handover/xeon-amx-as-avx512-bf16/bfloat16")
FP32_AVX512 = _table("ggml-handover/xeon-amx/float32")


# A bf16 engine on a CPU without native bf16 (no AVX-512 BF16 or AMX: the avx512 backend's Intel guests without the
# extension, a bf16 engine the user asks for on AVX2): torch's bf16 GEMM converts in software, and ggml stays ahead.
SOFTWARE_BF16 = _table("ggml-handover/xeon-amx-as-avx512/bfloat16")


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
    if not GGML_OP_CLASSES & set(planned_kernels.split(",")):
        return PolicyResult()
    tables = tables_for(tables, native_bf16)
    table = tables.get(dtype) or tables["bfloat16"]
    why = (
        f"{dtype} activations: ggml's matmul below these rows, dequantize + the {table.gemm} from them: "
        f"{describe(table)}. The first row count where the GEMM ran faster: {table.measured}"
    )
    if table.backend != backend:
        why += f"; not measured on {backend}: the {table.backend} machine's {table.gemm} is the nearest measured"
    value = handover_env({d: t.rows for d, t in tables.items()})
    return PolicyResult.of(env(HANDOVER_ENV, value, why, "policy"))
