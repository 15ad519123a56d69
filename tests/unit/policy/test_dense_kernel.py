"""Where the service keeps an fp32 model's linear weights in bf16 (service/policy/linear/dense_kernel.py): on AVX2 and
AVX-512 without its bf16 extension by default where its kernels are built, elsewhere when asked; never for quantized
models. A bf16 engine on a CPU without native bf16 runs them on the service's kernel by default on the avx512
backend, elsewhere when asked; with native bf16 it is left to vLLM."""

from __future__ import annotations

import pytest

from service.facts.model import inspect_model
from service.policy.gguf.model_source import kept_bytes
from service.policy.linear.dense_kernel import OURS_BF16, VLLM_BF16
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import load_settings
from tests.support.gguf_models import tiny_gguf
from tests.support.server import MODELS as GGUF_MODELS
from tests.unit.conftest import software
from tests.unit.policy.test_policy_engine import GiB, decision, hw
from tests.unit.policy.test_quant_policy import AMX, AVX2, AVX512, LLAMA, W8A8_DYNAMIC, ZEN, quant_plan

BUILT = "ggml from llama-cpp-python 0.3.36"
NO_BF16_VM, ICELAKE = "xeon_emeraldrapids_kvm_nobf16.txt", "xeon_8380_icelake.txt"  # AVX-512 without its bf16
BF16_ENGINE_MEASURED = "python bench/parts/quant_kernels.py --formats bf16"
FP32_LLAMA = {**LLAMA, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(
    "cpu,measured",
    [(AVX2, "measured: claim/bf16-weights-gemv/avx2"), (AVX512, "measured: claim/bf16-weights-engine/emeraldrapids")],
)
def test_fp32_engines_keep_bf16_weights_where_the_kernel_is_built(tmp_path, cpu, measured):
    p = quant_plan(FP32_LLAMA, cpu, tmp_path, ggml_kernel=BUILT, dtype="float32")
    d = decision(p, "engine.linear_weights")
    assert (d.value, d.source) == ("bf16", "policy")
    assert measured in d.reason and "not bf16 keep vLLM's fp32 GEMM" in d.reason  # the measurement, the exactness
    assert p.env["SERVICE_LINEAR_KERNELS"] == "Bf16WeightsLinear"


def test_a_checkpoint_not_stored_in_bf16_keeps_fp32_weights(tmp_path):
    p = quant_plan({**LLAMA, "torch_dtype": "float32"}, AVX2, tmp_path, ggml_kernel=BUILT)
    d = decision(p, "engine.linear_weights")
    assert (d.value, d.reason) == ("fp32", "the checkpoint's weights are float32, not bf16 values to keep")
    assert "SERVICE_LINEAR_KERNELS" not in p.env


def test_without_the_build_avx2_says_why_it_stays_fp32(tmp_path):
    d = decision(quant_plan(FP32_LLAMA, AVX2, tmp_path), "engine.linear_weights")
    assert d.value == "fp32" and "make kernels" in d.reason
    asked = quant_plan(FP32_LLAMA, ZEN, tmp_path, dtype="float32", bf16_weights="on")
    assert any("bf16_weights=on" in e and "make kernels" in e for e in asked.errors), asked.errors


def test_other_backends_keep_fp32_weights_unless_asked(tmp_path):
    for cpu in (ZEN, AMX):
        p = quant_plan(FP32_LLAMA, cpu, tmp_path, ggml_kernel=BUILT, dtype="float32")
        kept = decision(p, "engine.linear_weights")
        assert kept.value == "fp32" and "SERVICE_LINEAR_KERNELS" not in p.env
        assert "measured: claim/bf16-weights-engine/zen4" in kept.reason  # what the other choice measured
        asked = quant_plan(FP32_LLAMA, cpu, tmp_path, ggml_kernel=BUILT, dtype="float32", bf16_weights="on")
        assert (decision(asked, "engine.linear_weights").value, asked.env["SERVICE_LINEAR_KERNELS"]) == (
            "bf16",
            "Bf16WeightsLinear",
        )
    off = quant_plan(FP32_LLAMA, AVX2, tmp_path, ggml_kernel=BUILT, bf16_weights="off")
    assert decision(off, "engine.linear_weights").source == "user" and "SERVICE_LINEAR_KERNELS" not in off.env


def test_native_bf16_and_quantized_engines_are_left_alone(tmp_path):
    for p in (
        quant_plan(FP32_LLAMA, ZEN, tmp_path, ggml_kernel=BUILT),  # bf16 engine, AVX-512 BF16
        quant_plan(FP32_LLAMA, AMX, tmp_path, ggml_kernel=BUILT, bf16_weights="on"),
        quant_plan(W8A8_DYNAMIC, AVX2, tmp_path, ggml_kernel=BUILT, bf16_weights="on"),
    ):
        assert not [d for d in p.decisions if d.setting == "engine.linear_weights"]


@pytest.mark.parametrize("cpu", [NO_BF16_VM, ICELAKE])
def test_a_bf16_engine_without_native_bf16_runs_the_services_kernel_on_avx512(tmp_path, cpu):
    p = quant_plan(FP32_LLAMA, cpu, tmp_path, ggml_kernel=BUILT)
    assert decision(p, "engine.dtype").value == "bfloat16"
    d = decision(p, "engine.linear_weights")
    assert (d.value, d.source) == (OURS_BF16, "policy")
    assert BF16_ENGINE_MEASURED in d.reason and BUILT in d.reason  # the measurement it rests on, the build
    assert p.env["SERVICE_LINEAR_KERNELS"] == "Bf16WeightsLinear"
    off = quant_plan(FP32_LLAMA, cpu, tmp_path, ggml_kernel=BUILT, bf16_weights="off")
    assert (decision(off, "engine.linear_weights").value, decision(off, "engine.linear_weights").source) == (
        VLLM_BF16,
        "user",
    )
    assert "SERVICE_LINEAR_KERNELS" not in off.env
    unbuilt = decision(quant_plan(FP32_LLAMA, cpu, tmp_path), "engine.linear_weights")
    assert unbuilt.value == VLLM_BF16 and "make kernels" in unbuilt.reason
    asked = quant_plan(FP32_LLAMA, cpu, tmp_path, bf16_weights="on")
    assert any("bf16_weights=on" in e and "make kernels" in e for e in asked.errors), asked.errors


def test_a_bf16_engine_on_avx2_keeps_vllms_gemm_unless_asked(tmp_path):
    p = quant_plan(FP32_LLAMA, AVX2, tmp_path, ggml_kernel=BUILT, dtype="bfloat16")
    d = decision(p, "engine.linear_weights")
    assert (d.value, d.source) == (VLLM_BF16, "default") and "bf16_weights=on" in d.reason
    assert "SERVICE_LINEAR_KERNELS" not in p.env
    asked = quant_plan(FP32_LLAMA, AVX2, tmp_path, ggml_kernel=BUILT, dtype="bfloat16", bf16_weights="on")
    assert (decision(asked, "engine.linear_weights").value, asked.env["SERVICE_LINEAR_KERNELS"]) == (
        OURS_BF16,
        "Bf16WeightsLinear",
    )


def test_a_gguf_files_kept_blocks_are_named_and_bf16_weights_says_it_has_nothing_to_change(tmp_path):
    model = inspect_model(str(tiny_gguf(GGUF_MODELS, "llama", "Q4_0")))
    for cpu, dtype in ((AVX2, "float32"), (ZEN, "bfloat16")):  # in an fp32 and in a bf16 engine
        for asked, says in (({}, None), ({"bf16_weights": "on"}, "bf16_weights=on applies to dense weights")):
            settings = load_settings(gguf_blocks="on", dtype=dtype, **asked)
            p = plan_engine(PlanInputs(hw(cpu, memory=256 * GiB), model, software(True, None, BUILT), settings, {}))
            assert decision(p, "engine.dtype").value == dtype
            d = decision(p, "engine.linear_weights")
            assert d.value == "gguf Q4_0" and "ggml's kernel" in d.reason
            assert (says in d.reason) if says else "bf16_weights" not in d.reason
            assert p.env["SERVICE_LINEAR_KERNELS"] == "GgufBlocksLinearMethod"


def test_the_kv_cache_gets_what_kept_blocks_leave_unused():
    """Memory is planned for the weights as the engine holds them: kept blocks as stored, not dequantized."""
    model = inspect_model(str(tiny_gguf(GGUF_MODELS, "llama", "Q4_0")))
    gguf = model.gguf
    for cpu, dtype, size in ((AVX2, "float32", 4), (ZEN, "bfloat16", 2)):
        kv = {
            blocks: decision(
                plan_engine(
                    PlanInputs(
                        hw(cpu, memory=8 * GiB),
                        model,
                        software(True, None, BUILT),
                        load_settings(
                            gguf_blocks=blocks, dtype=dtype, memory_headroom_gib=7.75, tensor_parallel_size=1
                        ),
                        {},
                    )
                ),
                "engine.kv_cache_memory_bytes",
            ).value
            for blocks in ("on", "off")
        }
        stored_bytes, stored_elements = kept_bytes(gguf, per_token=False)  # the linear layers' and the head's
        assert kv["on"] - kv["off"] == stored_elements * size - stored_bytes > 0, (dtype, kv)


@pytest.mark.parametrize("kernels,per_token", [(BUILT, 3_000 * 2 + 1_000 * 4), (None, 4_000 * 4)])
def test_projections_kept_bf16_are_read_per_token_in_bf16(tmp_path, kernels, per_token):
    """model.read_per_token (the bench's ceiling) counts the projections the fp32 engine keeps in bf16 at 2 bytes,
    the other floats in fp32; without the kernel, all of them in fp32."""
    from dataclasses import replace

    from service.facts.model import DecodeReads

    quant_plan(FP32_LLAMA, AVX2, tmp_path)  # writes the model's config
    facts = replace(
        inspect_model(str(tmp_path / "m")),
        decode_reads=DecodeReads(float_elements=4_000, packed_bytes=0, projection_elements=3_000),
    )
    p = plan_engine(PlanInputs(hw(AVX2), facts, software(True, "0.16.0", kernels), load_settings(dtype="float32"), {}))
    reads = decision(p, "model.read_per_token")
    assert reads.value == per_token
    assert ("projection weights kept in bfloat16" in reads.reason) == (kernels is not None)
