"""Pre-flight kernel limits: models vLLM's CPU kernels cannot run are refused before loading, with the limit."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from service.__main__ import app
from service.facts.cpu import Isa
from service.facts.model import inspect_model
from service.facts.vllm_kernel_limits import GDN
from service.policy.engine.preflight import check_kernels
from service.policy.machine.backends import BACKENDS
from tests.unit.conftest import CPUINFO, MODELS

SETTING = "preflight.kernels"
MISMATCHED = MODELS / "tiny-qwen3-next-gdn-k64-v128"  # config of tests/support/tiny_models.py's unequal-heads model
QWEN3_NEXT = MODELS / "qwen3-next-80b-a3b-instruct"
runner = CliRunner()
BF16 = Isa(avx2=True, avx512=True, avx512_vnni=True, avx512_bf16=True)
ISA = {  # a CPU each backend runs on
    "amx": Isa(avx2=True, avx512=True, avx512_vnni=True, avx512_bf16=True, amx_tile=True, amx_bf16=True, amx_int8=True),
    "avx512": Isa(avx2=True, avx512=True, avx512_vnni=True),
    "avx2": Isa(avx2=True),
    "zen": BF16,
}


def detect(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["detect", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def test_unequal_gdn_key_and_value_head_dims_are_refused_with_the_models_values():
    check = check_kernels(inspect_model(str(MISMATCHED)), BACKENDS["avx512"], "bfloat16", BF16)
    assert check.find(SETTING) is None and len(check.errors) == 1
    assert "expect head_dim to be equal to head_dim_v" in check.errors[0]
    assert "linear_key_head_dim 64, linear_value_head_dim 128" in check.errors[0]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_real_qwen3_next_fits_every_backends_kernels(backend):
    check = check_kernels(inspect_model(str(QWEN3_NEXT)), BACKENDS[backend], "bfloat16", ISA[backend])
    assert check.errors == ()
    decision = check.find(SETTING)
    assert decision.value == "pass"
    assert "16x128 key / 32x128 value" in decision.reason and "head_dim 256" in decision.reason


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"linear_key_head_dim": 32, "linear_value_head_dim": 32}, "compiled for linear head dims 64, 128 only"),
        ({"linear_key_head_dim": 256, "linear_value_head_dim": 256}, "linear_key_head_dim 256"),
        ({"linear_num_key_heads": 12}, "32 value and 12 key heads"),
        ({"head_dim": 72}, "attention head_dim 72 is not one of the CPU attention kernel's head sizes"),
    ],
)
def test_each_gdn_and_attention_limit(change, expected):
    model = dataclasses.replace(inspect_model(str(QWEN3_NEXT)), **change)
    errors = check_kernels(model, BACKENDS["amx"], "bfloat16", ISA["amx"]).errors
    assert len(errors) == 1 and expected in errors[0]


@pytest.mark.parametrize(("isa", "refused"), [(BF16, True), (ISA["avx512"], False), (ISA["avx2"], False)])
def test_gdn_conv_width_other_than_4_only_where_vllm_runs_the_cpp_conv(isa, refused):
    model = dataclasses.replace(inspect_model(str(QWEN3_NEXT)), linear_conv_kernel_dim=3)
    errors = check_kernels(model, BACKENDS["avx512"], "bfloat16", isa).errors
    assert (errors != ()) == refused
    assert not refused or "linear_conv_kernel_dim 4 only" in errors[0] and "this model has 3" in errors[0]


def test_gdn_runs_bf16_only_and_zen_has_no_fp16():
    qwen3_next = inspect_model(str(QWEN3_NEXT))
    (error,) = check_kernels(qwen3_next, BACKENDS["amx"], "float32", ISA["amx"]).errors
    assert "bfloat16 only, not float32" in error
    llama = inspect_model(str(MODELS / "llama-3.1-8b-instruct"))
    assert check_kernels(llama, BACKENDS["amx"], "float32", ISA["amx"]).errors == ()  # dense models run fp32
    (error,) = check_kernels(llama, BACKENDS["zen"], "float16", BF16).errors
    assert "bfloat16/float32, not float16" in error and "zen_cpu.py" in error


def test_mla_and_models_without_gdn_keys_skip_those_checks():
    deepseek = inspect_model(str(MODELS / "deepseek-v3"))
    assert deepseek.uses_mla and check_kernels(deepseek, BACKENDS["avx512"], "bfloat16", BF16).errors == ()
    assert GDN.head_dims == frozenset({64, 128}) and GDN.equal_key_value_head_dims


def test_detect_refuses_the_mismatched_model_before_loading():
    code, report = detect("--cpuinfo", str(CPUINFO / "epyc_zen5_kvm.txt"), "--model", str(MISMATCHED))
    assert code == 1
    assert any("expect head_dim to be equal to head_dim_v" in e for e in report["errors"]), report["errors"]
    assert report["model"]["linear_key_head_dim"] == 64 and report["model"]["linear_value_head_dim"] == 128


def test_detect_passes_the_real_qwen3_next_and_says_what_it_checked():
    code, report = detect(
        "--cpuinfo",
        str(CPUINFO / "xeon_8480_sapphirerapids.txt"),
        "--model",
        str(QWEN3_NEXT),
        "--max-model-len",
        "4096",
    )
    assert report["errors"] == [] and code == 0
    (kernels,) = [d for d in report["decisions"] if d["setting"] == SETTING]
    assert kernels["value"] == "pass" and "GDN" in kernels["reason"]
