"""Where the service's ggml kernels hand batches to torch's GEMM (service/policy/linear/ggml_handover.py): per backend and
activation dtype the table measured on the nearest GEMM, planned where a ggml kernel runs (and for a calibration
candidate that runs one), and read by the kernels when a layer loads."""

from __future__ import annotations

import pytest
import torch

from service.facts.model import inspect_model
from service.in_vllm.contract import HANDOVER_ENV
from service.kernels.registry import parse_handover
from service.policy.linear.ggml_handover import (
    BF16_AMX,
    BF16_AVX512,
    BF16_ZEN4,
    FP32_AVX512,
    FP32_ZEN2,
    K_QUANTS,
    SOFTWARE_BF16,
)
from service.policy.machine.backends import BACKENDS
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import load_settings
from tests.support.gguf_models import tiny_gguf
from tests.support.server import MODELS
from tests.unit.conftest import CPUINFO, software
from tests.unit.policy.test_policy_engine import decision, hw
from tests.unit.policy.test_quant_policy import AMX, AVX2, AVX512, GGML, W4A16, W8A8_DYNAMIC, ZEN, kernel, quant_plan

GiB = 1 << 30
NO_BF16 = "xeon_emeraldrapids_kvm_nobf16.txt"  # AVX-512 without AVX-512 BF16 or AMX: the avx512 backend
SETTING = f"env.{HANDOVER_ENV}"


def test_every_backend_names_a_table_per_engine_dtype_and_every_table_its_gemm():
    for backend in BACKENDS.values():
        assert set(backend.ggml_handover) == {"bfloat16", "float32"}, backend.name
    for table in (BF16_ZEN4, FP32_ZEN2, BF16_AMX, BF16_AVX512, FP32_AVX512):
        assert table.backend in BACKENDS and table.gemm and table.measured
        assert all(rows > 0 for rows in table.rows.values())  # a type that never hands over is left out


def test_amx_hands_over_where_its_own_gemm_was_measured(tmp_path):
    p = quant_plan(W4A16, AMX, tmp_path, ggml_kernel=GGML, int4_kernel="ggml")
    assert kernel(p) == "ggml-q4_0"
    tables = parse_handover(p.env[HANDOVER_ENV])
    assert tables == {"bfloat16": dict(BF16_AMX.rows), "float32": dict(FP32_AVX512.rows)}
    why = decision(p, SETTING).reason
    assert why.startswith("bfloat16 activations") and "AMX bf16 GEMM" in why and "Q4_K from 128 rows" in why
    assert "not measured on" not in why
    # AMX's bf16 GEMM takes over from fewer rows than Zen 4's, and even for the K-quants, which Zen 4's never did
    assert all(BF16_AMX.row(t) <= BF16_ZEN4.row(t) for t in BF16_ZEN4.rows) and BF16_AMX.rows != BF16_ZEN4.rows
    assert all(BF16_AMX.row(t) and not BF16_ZEN4.row(t) for t in K_QUANTS)


def test_a_table_borrowed_from_another_backend_says_so(tmp_path):
    p = quant_plan(W4A16, ZEN, tmp_path, ggml_kernel=GGML, dtype="float32")
    assert kernel(p) == "ggml-q4_0"
    why = decision(p, SETTING).reason
    assert why.startswith("float32 activations") and "Q4_0 from 512 rows" in why
    assert "not measured on zen: the avx2 machine's AVX2 fp32 GEMM is the nearest measured" in why
    avx2 = quant_plan(W8A8_DYNAMIC, AVX2, tmp_path, ggml_kernel=GGML)
    assert kernel(avx2) == "ggml-q8_0" and "not measured on" not in decision(avx2, SETTING).reason


def test_no_table_where_no_ggml_kernel_runs(tmp_path):
    p = quant_plan(W4A16, AMX, tmp_path, ggml_kernel=GGML)  # vLLM's AMX W4A8
    assert kernel(p) == "amx-w4a8"
    assert HANDOVER_ENV not in p.env and not [d for d in p.decisions if d.setting == SETTING]


def test_a_calibration_candidate_that_runs_ggml_carries_the_table(tmp_path):
    p = quant_plan(W4A16, AMX, tmp_path, ggml_kernel=GGML)
    (question,) = [q for q in p.questions if q.decision == "int4_kernel"]
    assert any(c.kernel.startswith("ggml") for c in question.candidates)
    for candidate in question.candidates:
        assert (HANDOVER_ENV in candidate.env) == candidate.kernel.startswith("ggml"), candidate


@pytest.mark.parametrize(
    ("cpu", "table", "said"), [(AMX, BF16_AMX, "Q4_K from 128 rows"), (ZEN, BF16_ZEN4, "Q4_K, Q5_K, Q6_K never")]
)
def test_a_gguf_files_blocks_get_the_table_of_the_engine(cpu, table, said):
    model = inspect_model(str(tiny_gguf(MODELS, "llama", "Q4_K")))
    settings = load_settings(tensor_parallel_size=1)  # the recorded CPUs have two sockets: one rank keeps the blocks
    p = plan_engine(PlanInputs(hw(cpu, memory=256 * GiB), model, software(True, ggml_kernel=GGML), settings, {}))
    assert decision(p, "model.gguf_blocks").value == "Q4_K"
    assert parse_handover(p.env[HANDOVER_ENV])["bfloat16"] == dict(table.rows)
    assert said in decision(p, SETTING).reason


def test_the_kernels_read_the_planned_table_and_keep_the_first_measured_outside_an_engine(tmp_path, monkeypatch):
    from service.kernels.ggml_linear import dense_from, handover

    monkeypatch.delenv(HANDOVER_ENV, raising=False)
    assert handover("Q4_0") == {"bfloat16": BF16_ZEN4.row("Q4_0"), "float32": FP32_ZEN2.row("Q4_0")}
    assert handover("Q4_K") == {"bfloat16": 0, "float32": 0}
    planned = quant_plan(W4A16, AMX, tmp_path, ggml_kernel=GGML, int4_kernel="ggml").env[HANDOVER_ENV]
    monkeypatch.setenv(HANDOVER_ENV, planned)
    rows = handover("Q4_K")
    assert rows == {"bfloat16": BF16_AMX.row("Q4_K"), "float32": 0}
    assert dense_from(rows, torch.bfloat16) == dense_from(rows, torch.float16) == 128  # fp16 takes bf16's
    assert dense_from(rows, torch.float32) == 0


def test_a_bf16_engine_without_native_bf16_keeps_ggml_at_every_row_count(tmp_path):
    """The avx512 backend's Intel guests without AVX-512 BF16 run a bf16 engine, whose GEMM converts in software."""
    p = quant_plan(W4A16, NO_BF16, tmp_path, ggml_kernel=GGML, auto_round_lib=None)
    assert kernel(p) == "ggml-q4_0" and decision(p, "engine.dtype").value == "bfloat16"
    tables = parse_handover(p.env[HANDOVER_ENV])
    assert tables == {"bfloat16": {}, "float32": dict(FP32_AVX512.rows)}
    why = decision(p, SETTING).reason
    assert "bf16 GEMM converted in software" in why and "no type, ggml's matmul at every row count" in why
    with_bf16 = quant_plan(W4A16, AVX512, tmp_path, ggml_kernel=GGML, auto_round_lib=None)
    assert parse_handover(with_bf16.env[HANDOVER_ENV])["bfloat16"] == dict(BF16_AVX512.rows)
    assert "not measured on" not in decision(with_bf16, SETTING).reason


def _recorded_flags(name: str) -> frozenset[str]:
    """The first `flags` line of a recording (Arm's have `Features` instead: no x86 flag)."""
    lines = (CPUINFO / name).read_text().splitlines()
    return frozenset(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), ()))


X86_RECORDINGS = sorted(p.name for p in CPUINFO.glob("*.txt") if "avx2" in _recorded_flags(p.name))


@pytest.mark.parametrize("cpu", X86_RECORDINGS)
def test_every_recorded_cpu_gets_its_backends_bf16_table_only_where_it_computes_bf16(cpu, tmp_path):
    """The rule the live engine test (test_gguf_file) derives from torch: AVX-512 BF16 or AMX bf16 in the CPU's own
    flags, or the bf16 table converts in software (Zen 1-3 and the Intel guests without the extension)."""
    native = bool({"avx512_bf16", "amx_bf16"} & _recorded_flags(cpu))
    p = quant_plan(W4A16, cpu, tmp_path, ggml_kernel=GGML, int4_kernel="ggml")
    assert kernel(p) == "ggml-q4_0", cpu
    backend = BACKENDS[p.backend.name]
    tables = parse_handover(p.env[HANDOVER_ENV])
    assert tables["float32"] == dict(backend.ggml_handover["float32"].rows)
    bf16 = backend.ggml_handover["bfloat16"] if native else SOFTWARE_BF16
    assert tables["bfloat16"] == dict(bf16.rows), (cpu, backend.name)
    assert ("bf16 GEMM converted in software" in decision(p, SETTING).reason) == (
        not native and decision(p, "engine.dtype").value == "bfloat16"
    )
