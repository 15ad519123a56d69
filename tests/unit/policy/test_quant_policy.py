"""Quantized checkpoints: facts from config.json, the kernel per (format x backend), knobs, refusals, overrides."""

from __future__ import annotations

import json
import re

import pytest

from service.facts.model import inspect_model
from service.facts.quantization import read_quantization
from service.kernels.registry import KERNELS
from service.policy.linear.quant import plan_quant
from service.policy.linear.quant_measurements import find
from service.policy.machine.backends import BACKENDS
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import Settings, load_settings
from tests.unit.conftest import CPUINFO, MODELS, software
from tests.unit.policy.test_policy_engine import decision, hw, plan

ZEN, AMX, AVX512, AVX2 = (
    "epyc_9755_zen5.txt",
    "xeon_8480_sapphirerapids.txt",
    "xeon_emeraldrapids_kvm_noamx.txt",
    "epyc_7763_zen3.txt",
)
GiB = 1024**3

LLAMA = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)


def ct_config(weights: dict, activations: dict | None = None, fmt: str = "pack-quantized", **extra) -> dict:
    group = {"targets": ["Linear"], "weights": {"type": "int", "symmetric": True, "dynamic": False, **weights}}
    group["input_activations"] = activations
    return {
        **LLAMA,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": fmt,
            "config_groups": {"group_0": group},
            "ignore": ["lm_head"],
            **extra,
        },
    }


W4A16 = ct_config({"num_bits": 4, "strategy": "group", "group_size": 128})
W8A8_DYNAMIC = ct_config(
    {"num_bits": 8, "strategy": "channel"},
    {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"},
    fmt="int-quantized",
)
W8A8_STATIC = ct_config(
    {"num_bits": 8, "strategy": "channel"},
    {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False, "strategy": "tensor"},
    fmt="int-quantized",
)


def quant_plan(
    config: dict,
    cpu: str,
    tmp_path,
    env=None,
    auto_round_lib: str | None = "0.16.0",
    ggml_kernel: str | None = None,
    **settings,
):
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": 2,
                "max_position_embeddings": 4096,
                **config,
            }
        )
    )
    return plan_engine(
        PlanInputs(
            hw(cpu, memory=256 * GiB),
            inspect_model(str(d)),
            software(True, auto_round_lib, ggml_kernel),
            load_settings(**settings),
            env or {},
        )
    )


def kernel(p) -> str:
    return decision(p, "quant.linear_kernel").value


def test_facts_of_a_compressed_tensors_w4a16_checkpoint():
    f = read_quantization(W4A16)
    assert (f.key, f.weight_bits, f.group_size, f.weight_symmetric, f.act_order, f.activation_scheme) == (
        "w4a16",
        4,
        128,
        True,
        None,
        None,
    )
    assert [(s.name, s.in_features, s.out_features) for s in f.linear_shapes] == [
        ("qkv_proj", 4096, 6144),
        ("o_proj", 4096, 4096),
        ("gate_up_proj", 4096, 28672),
        ("down_proj", 14336, 4096),
    ]


def test_facts_of_static_and_dynamic_w8a8():
    assert read_quantization(W8A8_DYNAMIC).activation_scheme == "dynamic"
    static = read_quantization(W8A8_STATIC)
    assert (static.key, static.activation_scheme, static.activation_strategy) == ("w8a8", "static", "tensor")


def test_facts_of_the_recorded_gptq_model(tmp_path):
    f = inspect_model(str(MODELS / "qwen2.5-7b-instruct-gptq-int4")).quant
    assert (f.key, f.group_size, f.weight_symmetric, f.act_order) == ("gptq-w4a16", 128, True, None)


def test_ignored_projections_are_not_checked():
    f = read_quantization(
        ct_config({"num_bits": 4, "strategy": "group", "group_size": 128}, ignore=["lm_head", "re:.*down_proj"])
    )
    assert "down_proj" not in [s.name for s in f.linear_shapes]


@pytest.mark.parametrize(
    ("cpu", "config", "expected"),
    [
        (ZEN, W8A8_DYNAMIC, "zentorch-w8a8"),
        (ZEN, W8A8_STATIC, "onednn-w8a8"),  # zentorch qlinear needs dynamic activations: named fallback
        (AMX, W8A8_DYNAMIC, "amx-w8a8"),
        (AVX512, W8A8_DYNAMIC, "onednn-w8a8"),
        (AVX2, W8A8_STATIC, "onednn-w8a8"),
        (ZEN, W4A16, "zentorch-woq"),  # the measured Zen default: weight-only, VLLM_CPU_INT4_W4A8=0
        (AMX, W4A16, "amx-w4a8"),
        (AVX512, W4A16, "auto-round"),  # the service's auto-round-lib kernel, measured fastest there
    ],
)
def test_kernel_per_format_and_backend(tmp_path, cpu, config, expected):
    p = quant_plan(config, cpu, tmp_path)
    assert not p.errors
    d = decision(p, "quant.linear_kernel")
    assert d.value == expected and KERNELS[expected].vllm_class in d.reason and d.source == "policy"


def test_zen_int4_default_comes_from_the_measurement_and_says_so(tmp_path):
    d = decision(quant_plan(W4A16, ZEN, tmp_path), "env.VLLM_CPU_INT4_W4A8")
    assert (d.value, d.source) == ("0", "policy")
    woq, da8w4 = (find("zen", "w4a16", k) for k in ("zentorch-woq", "zentorch-da8w4"))
    assert woq is not None and da8w4 is not None and woq.decode_tok_s > da8w4.decode_tok_s
    assert woq.describe() in d.reason and da8w4.describe() in d.reason and woq.machine.how in d.reason


def test_user_turns_da8w4_back_on(tmp_path):
    p = quant_plan(W4A16, ZEN, tmp_path, int4_w4a8=True)
    assert decision(p, "env.VLLM_CPU_INT4_W4A8").source == "user" and p.env["VLLM_CPU_INT4_W4A8"] == "1"
    d = decision(p, "quant.linear_kernel")
    assert (d.value, d.source) == ("zentorch-da8w4", "user")


def test_int4_knob_set_in_the_environment_is_respected_not_overwritten(tmp_path):
    p = quant_plan(W4A16, ZEN, tmp_path, env={"VLLM_CPU_INT4_W4A8": "1"})
    assert kernel(p) == "zentorch-da8w4" and "VLLM_CPU_INT4_W4A8" not in p.env
    assert decision(p, "env.VLLM_CPU_INT4_W4A8").source == "user"


def test_int4_knob_is_left_alone_where_it_has_no_effect(tmp_path):
    p = quant_plan(W4A16, AVX512, tmp_path)
    assert "VLLM_CPU_INT4_W4A8" not in p.env
    assert not [d for d in p.decisions if d.setting == "env.VLLM_CPU_INT4_W4A8"]


def test_zen_w8a8_favours_decode_and_the_user_can_choose_prefill(tmp_path):
    default = decision(quant_plan(W8A8_DYNAMIC, ZEN, tmp_path), "quant.linear_kernel")
    assert "favours decode" in default.reason and "w8a8_zentorch=false" in default.reason
    zen, onednn = (find("zen", "w8a8", k) for k in ("zentorch-w8a8", "onednn-w8a8"))
    assert zen is not None and onednn is not None
    assert zen.describe() in default.reason and onednn.describe() in default.reason
    p = quant_plan(W8A8_DYNAMIC, ZEN, tmp_path, w8a8_zentorch=False)
    assert p.env["VLLM_DISABLED_KERNELS"] == "ZentorchInt8ScaledMMLinearKernel"
    assert decision(p, "quant.linear_kernel").value == "onednn-w8a8"
    assert decision(p, "quant.linear_kernel").source == "user"


def test_disabled_kernels_from_the_environment_are_kept(tmp_path):
    p = quant_plan(W8A8_DYNAMIC, ZEN, tmp_path, env={"VLLM_DISABLED_KERNELS": "Foo"}, w8a8_zentorch=False)
    assert p.env["VLLM_DISABLED_KERNELS"] == "Foo,ZentorchInt8ScaledMMLinearKernel"


def test_fp32_activations_take_zen_int4_to_weight_only(tmp_path):
    p = quant_plan(W4A16, ZEN, tmp_path, int4_w4a8=True, dtype="float32")
    d = decision(p, "quant.linear_kernel")
    assert d.value == "zentorch-woq" and "bf16 activations" in d.reason


def test_mixed_kernels_name_their_layers(tmp_path):
    # down_proj's K is not a whole number of 64-wide groups: zentorch cannot take it, vLLM's generic kernel can.
    config = ct_config({"num_bits": 4, "strategy": "group", "group_size": 64})
    config["intermediate_size"] = 14336 + 32  # down_proj K not a multiple of 64
    p = quant_plan(config, ZEN, tmp_path)
    d = decision(p, "quant.linear_kernel")
    assert d.value == "zentorch-woq+wna16-vec" and "down_proj: CPUWNA16LinearKernel" in d.reason


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (ct_config({"num_bits": 4, "strategy": "group", "group_size": 128, "actorder": "group"}), "actorder=group"),
        (ct_config({"num_bits": 8, "strategy": "group", "group_size": 128}), "8-bit weight-only"),
        (
            {
                **LLAMA,
                "quantization_config": {
                    "quant_method": "gptq",
                    "bits": 4,
                    "group_size": 128,
                    "desc_act": True,
                    "sym": True,
                },
            },
            "desc_act=True",
        ),
        (
            {
                **LLAMA,
                "quantization_config": {
                    "quant_method": "gptq",
                    "bits": 4,
                    "group_size": 128,
                    "desc_act": False,
                    "sym": False,
                },
            },
            "asymmetric GPTQ",
        ),
    ],
)
@pytest.mark.parametrize("cpu", [ZEN, AMX, AVX512])
def test_refusals_are_pre_flight_errors(tmp_path, cpu, config, message):
    p = quant_plan(config, cpu, tmp_path)
    assert any(message in e for e in p.errors)


INT4_CONFIGS = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
}


def int4_config(method: str) -> dict:
    return W4A16 if method == "compressed-tensors" else {**LLAMA, "quantization_config": INT4_CONFIGS[method]}


def handed_over(p) -> dict[str, str]:
    return {d.name: d.value for d in p.decisions if d.kind == "env" and d.passed}


@pytest.mark.parametrize("method", ["compressed-tensors", "gptq", "awq"])
def test_int4_on_avx2_runs_the_services_kernel(tmp_path, method):
    """vLLM 0.32 would pick CPUWNA16LinearKernel there, whose op its AVX2 build (_C_AVX2) lacks: the service's
    auto-round-lib kernel runs instead, registered by the plugin, with vLLM's int4 kernels out of its way."""
    p = quant_plan(int4_config(method), AVX2, tmp_path)
    assert not p.errors and kernel(p) == "auto-round"
    env = handed_over(p)
    assert env["SERVICE_LINEAR_KERNELS"] == "ArkWNA16LinearKernel"
    assert "CPUWNA16LinearKernel" in env["VLLM_DISABLED_KERNELS"].split(",")
    assert "_C_AVX2" in decision(p, "quant.linear_kernel").reason and "VLLM_CPU_INT4_W4A8" not in env


@pytest.mark.parametrize(
    ("settings", "library", "expected"),
    [
        ({}, None, "auto-round-lib (the service depends on it) is not installed"),
        ({"int4_kernel": "vllm"}, "0.16.0", "set by the user (int4_kernel=vllm)"),
    ],
)
def test_int4_on_avx2_without_the_services_kernel_is_refused_before_the_engine_dies(
    tmp_path, settings, library, expected
):
    p = quant_plan(W4A16, AVX2, tmp_path, auto_round_lib=library, **settings)
    assert any("cpu_gemm_wna16" in e and expected in e for e in p.errors), p.errors
    assert not [d for d in p.decisions if d.setting == "quant.linear_kernel"]


@pytest.mark.parametrize("cpu", [ZEN, AMX])
def test_the_user_can_run_the_services_int4_kernel_anywhere(tmp_path, cpu):
    default = quant_plan(W4A16, cpu, tmp_path)
    assert kernel(default) != "auto-round" and "SERVICE_LINEAR_KERNELS" not in handed_over(default)
    p = quant_plan(W4A16, cpu, tmp_path, env={"VLLM_DISABLED_KERNELS": "Other"}, int4_kernel="auto-round")
    assert kernel(p) == "auto-round" and decision(p, "quant.linear_kernel").source == "user"
    env = handed_over(p)
    assert env["VLLM_DISABLED_KERNELS"].split(",") == [
        "Other",
        "Dynamic4bitLinearKernel",
        "ZentorchWNA16LinearKernel",
        "CPUWNA16LinearKernel",
    ]
    assert "VLLM_CPU_INT4_W4A8" not in env  # read by vLLM's int4 kernels only


def test_requesting_the_services_int4_kernel_without_its_library_is_an_error(tmp_path):
    p = quant_plan(W4A16, ZEN, tmp_path, auto_round_lib=None, int4_kernel="auto-round")
    assert any("int4_kernel=auto-round" in e and "not installed" in e for e in p.errors), p.errors


def test_the_services_int4_kernel_refuses_shapes_its_layout_cannot_hold(tmp_path):
    config = ct_config({"num_bits": 4, "strategy": "group", "group_size": 16})
    config["intermediate_size"] = 688  # down_proj's input: not a multiple of 32
    p = quant_plan(config, AVX2, tmp_path)
    assert any("down_proj" in e and "multiple of 32" in e for e in p.errors), p.errors


def test_the_int4_kernel_setting_leaves_other_formats_alone(tmp_path):
    p = quant_plan(W8A8_DYNAMIC, AVX2, tmp_path, int4_kernel="auto-round")
    assert kernel(p) == "onednn-w8a8" and "SERVICE_LINEAR_KERNELS" not in handed_over(p)


def test_static_act_order_runs(tmp_path):
    p = quant_plan(
        ct_config({"num_bits": 4, "strategy": "group", "group_size": 128, "actorder": "static"}), AVX512, tmp_path
    )
    assert not p.errors and kernel(p) == "auto-round"  # folded into the weights: no g_idx for the kernel to read


def test_shapes_no_kernel_can_take_are_refused(tmp_path):
    config = ct_config({"num_bits": 4, "strategy": "group", "group_size": 16})
    config["intermediate_size"] = 688  # the demo model's down_proj: K=688 is not a multiple of 32
    p = quant_plan(config, AVX512, tmp_path)
    assert any("down_proj" in e and "multiples of 32" in e for e in p.errors)


def test_gptq_on_zen_is_a_named_fallback(tmp_path):
    config = {
        **LLAMA,
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    }
    p = quant_plan(config, ZEN, tmp_path)
    assert kernel(p) == "zentorch-wna16-fallback" and any("compressed-tensors W4A16 copy" in w for w in p.warnings)


def test_fp8_without_amx_warns_of_the_generic_path(tmp_path):
    p = quant_plan(
        {**LLAMA, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}, AVX512, tmp_path
    )
    assert kernel(p) == "torch-fp8" and any("torch._scaled_mm" in w for w in p.warnings)
    assert kernel(quant_plan({**LLAMA, "quantization_config": {"quant_method": "fp8"}}, AMX, tmp_path)) == "amx-fp8"


def test_unquantized_model_has_no_quant_decisions():
    p = plan(hw(AVX512, memory=256 * GiB), model_name="llama-3.1-8b-instruct", max_model_len=4096)
    assert not [d for d in p.decisions if d.setting.startswith("quant.")]


def test_plan_quant_without_facts_is_empty():
    assert plan_quant(None, BACKENDS["zen"], "bfloat16", Settings(), {}, vnni=True).decisions == ()


def test_a_measured_backend_is_cited_with_its_numbers_and_an_unmeasured_one_says_so():
    from service.policy.linear.quant_measurements import cite

    assert "wna16-vec: decode 6.0 [5.9-6.4] tok/s, prefill 58.0 [55.0-60.0] tok/s" in cite(
        "avx512", "w4a16", ("wna16-vec",)
    )
    assert cite("avx2", "w8a8", ("onednn-w8a8",)).startswith("not measured on the avx2 backend yet")


def test_zen_keeps_vllms_int4_kernel_where_the_service_kernel_measured_slower(tmp_path):
    from service.policy.linear.quant_measurements import MEASUREMENTS

    d = decision(quant_plan(W4A16, ZEN, tmp_path), "quant.linear_kernel")
    assert d.value == "zentorch-woq" and "SERVICE_LINEAR_KERNELS" not in quant_plan(W4A16, ZEN, tmp_path).env
    ours = [m for m in MEASUREMENTS if m.machine.backend == "zen" and m.kernel == "auto-round"]
    assert ours
    for m in ours:
        same_machine = [x for x in MEASUREMENTS if x.machine == m.machine and x.format == m.format]
        theirs = next(x for x in same_machine if x.kernel == "zentorch-woq")
        assert theirs.decode_tok_s > m.decode_tok_s
        assert f"measured on {m.machine.name}" in d.reason
        assert m.describe() in d.reason and theirs.describe() in d.reason


GGML = "ggml from llama-cpp-python 0.3.36"


@pytest.mark.parametrize("cpu", [ZEN, AVX2])
@pytest.mark.parametrize("method", ["compressed-tensors", "gptq"])
def test_symmetric_int4_runs_ggmls_q4_0_kernel_where_it_is_built(tmp_path, cpu, method):
    """llama.cpp's Q4_0 GEMV read the weights faster than vLLM's int4 kernels and auto-round-lib's on the CPUs
    measured: where the service's ggml kernel is built, it runs, registered by the plugin, vLLM's out of its way."""
    p = quant_plan(int4_config(method), cpu, tmp_path, ggml_kernel=GGML)
    assert not p.errors and kernel(p) == "ggml-q4_0"
    env = handed_over(p)
    assert env["SERVICE_LINEAR_KERNELS"] == "GgmlLinearKernel"
    assert "ZentorchWNA16LinearKernel" in env["VLLM_DISABLED_KERNELS"].split(",")
    reason = decision(p, "quant.linear_kernel").reason
    assert GGML in reason  # what runs, and the measurement it rests on where one was taken
    zen4 = "measured: quant/zen4-20261126-0523/w4a16/ggml-q4_0"  # the row the zen backend's default rests on
    assert (zen4 in reason) == (cpu == ZEN), reason


def test_avx512_int4_runs_auto_round_lib_first_as_measured_then_ggml(tmp_path):
    """On AVX-512 without AMX auto-round-lib's kernel decoded and prefilled faster than ggml's and vLLM's
    (quant_measurements.py): it runs where installed, even beside a ggml build; without it, ggml's."""
    p = quant_plan(W4A16, AVX512, tmp_path, ggml_kernel=GGML)
    assert not p.errors and kernel(p) == "auto-round"
    reason = decision(p, "quant.linear_kernel").reason
    ours, theirs = (find("avx512", "w4a16", k) for k in ("auto-round", "ggml-q4_0"))
    assert ours is not None and theirs is not None and ours.decode_tok_s > theirs.decode_tok_s
    assert ours.describe() in reason and theirs.describe() in reason, reason
    assert kernel(quant_plan(W4A16, AVX512, tmp_path, auto_round_lib=None, ggml_kernel=GGML)) == "ggml-q4_0"


def test_int4_with_zero_points_runs_ggmls_q4_1_kernel(tmp_path):
    p = quant_plan(int4_config("awq"), ZEN, tmp_path, ggml_kernel=GGML)
    assert not p.errors and kernel(p) == "ggml-q4_1"


def test_amx_keeps_vllms_int4_kernels_unless_asked(tmp_path):
    """vLLM's AMX W4A8 kernel has not been measured against ggml's: the table keeps vLLM's, the user (or the
    calibration) may pick ggml's."""
    assert kernel(quant_plan(W4A16, AMX, tmp_path, ggml_kernel=GGML)) == "amx-w4a8"
    p = quant_plan(W4A16, AMX, tmp_path, ggml_kernel=GGML, int4_kernel="ggml")
    assert kernel(p) == "ggml-q4_0" and decision(p, "quant.linear_kernel").source == "user"


def test_groups_ggml_cannot_hold_fall_back_to_the_next_kernel_with_the_reason(tmp_path):
    config = ct_config({"num_bits": 4, "strategy": "group", "group_size": 16})
    p = quant_plan(config, ZEN, tmp_path, ggml_kernel=GGML)
    assert kernel(p) == "zentorch-woq"
    assert "not ggml, which does not run" in decision(p, "quant.linear_kernel").reason
    avx2 = quant_plan(config, AVX2, tmp_path, ggml_kernel=GGML)
    assert kernel(avx2) == "auto-round"  # AVX2's next: vLLM has no int4 kernel there


def test_without_the_ggml_build_the_table_says_so_and_runs_the_next(tmp_path):
    p = quant_plan(W4A16, AVX2, tmp_path)
    assert kernel(p) == "auto-round"
    assert "the service's ggml kernel (make kernels) is not installed" in decision(p, "quant.linear_kernel").reason
    asked = quant_plan(W4A16, ZEN, tmp_path, int4_kernel="ggml")
    assert any("int4_kernel=ggml" in e and "make kernels" in e for e in asked.errors), asked.errors


def test_w8a8_on_avx2_runs_ggmls_q8_0_kernel_where_it_is_built(tmp_path):
    """vLLM's AVX2 int8 kernel (oneDNN without VNNI) decoded W8A8 at 3% of the read ceiling where llama.cpp's Q8_0
    read at 69%: the service's ggml kernel takes W8A8 there, vLLM's int8 kernels step aside."""
    for config in (W8A8_DYNAMIC, W8A8_STATIC):
        p = quant_plan(config, AVX2, tmp_path, ggml_kernel=GGML)
        assert not p.errors and kernel(p) == "ggml-q8_0"
        env = handed_over(p)
        assert env["SERVICE_LINEAR_KERNELS"] == "GgmlInt8LinearKernel"
        assert {"CPUInt8ScaledMMLinearKernel", "ZentorchInt8ScaledMMLinearKernel"} <= set(
            env["VLLM_DISABLED_KERNELS"].split(",")
        )
        reason = decision(p, "quant.linear_kernel").reason
        assert GGML in reason and "3% of the read ceiling" in reason, reason


def test_w8a8_keeps_vllms_int8_kernels_elsewhere_unless_asked(tmp_path):
    for cpu, theirs in ((ZEN, "zentorch-w8a8"), (AMX, "amx-w8a8"), (AVX512, "onednn-w8a8")):
        p = quant_plan(W8A8_DYNAMIC, cpu, tmp_path, ggml_kernel=GGML)
        assert kernel(p) == theirs and "SERVICE_LINEAR_KERNELS" not in p.env
        asked = quant_plan(W8A8_DYNAMIC, cpu, tmp_path, ggml_kernel=GGML, int8_kernel="ggml")
        assert kernel(asked) == "ggml-q8_0" and decision(asked, "quant.linear_kernel").source == "user"
        assert asked.env["SERVICE_LINEAR_KERNELS"] == "GgmlInt8LinearKernel"


def test_w8a8_without_the_ggml_build_runs_vllms_int8_kernel_and_says_why(tmp_path):
    p = quant_plan(W8A8_DYNAMIC, AVX2, tmp_path)
    assert kernel(p) == "onednn-w8a8"
    assert "the service's ggml kernel (make kernels) is not installed" in decision(p, "quant.linear_kernel").reason
    assert any("saturate" in w for w in p.warnings), p.warnings  # a Zen 3 has no VNNI
    asked = quant_plan(W8A8_DYNAMIC, ZEN, tmp_path, int8_kernel="ggml")
    assert any("int8_kernel=ggml" in e and "make kernels" in e for e in asked.errors), asked.errors
    vllm = quant_plan(W8A8_DYNAMIC, AVX2, tmp_path, ggml_kernel=GGML, int8_kernel="vllm")
    assert kernel(vllm) == "onednn-w8a8" and "SERVICE_LINEAR_KERNELS" not in vllm.env


def test_w8a8_layers_ggml_cannot_hold_run_vllms_kernel(tmp_path):
    config = {**W8A8_DYNAMIC, "hidden_size": 4100, "num_attention_heads": 41, "num_key_value_heads": 41}
    p = quant_plan(config, AVX2, tmp_path, ggml_kernel=GGML)
    assert kernel(p) == "onednn-w8a8"
    assert "not ggml, which does not run" in decision(p, "quant.linear_kernel").reason


def test_the_int8_kernel_setting_leaves_int4_models_alone(tmp_path):
    p = quant_plan(W4A16, AVX2, tmp_path, ggml_kernel=GGML, int8_kernel="vllm")
    assert kernel(p) == "ggml-q4_0"


def without_vnni(name: str, tmp_path) -> str:
    """A recorded cpuinfo with its VNNI flags taken out, as a guest that hides them (or a Skylake-SP) shows it."""
    text = (CPUINFO / name).read_text()
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8"):
        text = re.sub(rf" {flag}\b", "", text)
    path = tmp_path / f"novnni-{name}"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("cpu", [AVX2, "epyc_zen1_kvm_avx2.txt", AVX512, "xeon_8280_cascadelake.txt"])
def test_vllms_onednn_int8_kernel_warns_where_int8_dot_products_saturate(tmp_path, cpu):
    """Without VNNI oneDNN's int8 GEMM multiplies through vpmaddubsw, whose int16 pair sums saturate on full-range
    weights (measured on a Zen 2: SATURATES_WITHOUT_VNNI). Where it is asked for, it runs with a warning; it is no
    default there while ggml's exact kernel is installed. A CPU with VNNI runs it silently, as before."""
    names = [cpu] if not hw(cpu).cpu.isa.vnni else [cpu, without_vnni(cpu, tmp_path)]
    for name in names:
        vnni = hw(name).cpu.isa.vnni
        asked = quant_plan(W8A8_DYNAMIC, name, tmp_path, ggml_kernel=GGML, int8_kernel="vllm")
        assert kernel(asked) == "onednn-w8a8"
        warned = [w for w in asked.warnings if "vpmaddubsw" in w]
        assert len(warned) == (0 if vnni else 1), asked.warnings
        assert all(w in decision(asked, "quant.linear_kernel").reason for w in warned)
        default = quant_plan(W8A8_DYNAMIC, name, tmp_path, ggml_kernel=GGML)
        assert kernel(default) == ("onednn-w8a8" if vnni and hw(name).cpu.isa.avx512 else "ggml-q8_0")
        assert not [w for w in default.warnings if "vpmaddubsw" in w]
        if hw(name).cpu.isa.avx512 and not vnni:  # AVX-512's default is vLLM's, passed over here
            assert "whose int8 dot products saturate" in decision(default, "quant.linear_kernel").reason


def test_the_alder_lake_avx_vnni_counts_as_vnni():
    isa = hw("core_i7_12700k_alderlake.txt").cpu.isa
    assert isa.vnni and isa.avx_vnni and not isa.avx512_vnni
    assert not hw(AVX2).cpu.isa.vnni and hw(AVX512).cpu.isa.vnni


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_a_gptq_or_awq_kernel_cites_its_w4a16_measurement(tmp_path, method):
    """Their int4 layers are repacked into the layout the kernel takes a W4A16 copy in: its figures are theirs."""
    reason = decision(quant_plan(int4_config(method), AMX, tmp_path), "quant.linear_kernel").reason
    assert "the same kernels on a W4A16 copy: measured on" in reason and "amx-w4a8: decode" in reason, reason
    assert "not measured" not in reason
