"""Engine policy: every decision with its reason and source, user overrides, pre-flight failures."""

from __future__ import annotations

import dataclasses

import pytest

from service.facts.hardware import read_hardware
from service.facts.model import inspect_model
from service.policy.engine.dtype import MEASUREMENTS, Measurement
from service.policy.engine.memory import default_headroom
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import Settings
from tests.unit.conftest import CPUINFO, MODELS, SYSFS, software

GiB = 1024**3


def hw(name: str = "xeon_8480_sapphirerapids.txt", memory: int | None = 64 * GiB):
    facts = read_hardware(cpuinfo_path=CPUINFO / name)
    return dataclasses.replace(facts, limits=dataclasses.replace(facts.limits, memory_bytes=memory))


def model(name: str):
    return inspect_model(str(MODELS / name))


def plan(hardware=None, model_name="llama-3.1-8b-instruct", env=None, zen=True, **settings):
    return plan_engine(
        PlanInputs(
            hardware or hw(), model(model_name) if model_name else None, software(zen), Settings(**settings), env or {}
        )
    )


def decision(p, setting):
    found = [d for d in p.decisions if d.setting == setting]
    assert found, f"no decision for {setting}: {[d.setting for d in p.decisions]}"
    return found[0]


def test_every_decision_has_a_reason_and_a_known_source():
    p = plan()
    assert p.decisions and not p.errors
    for d in p.decisions:
        assert d.reason and d.source in {"default", "policy", "user"}


@pytest.mark.parametrize("gdn_model", ["qwen3-next-80b-a3b-instruct", "qwen3.5-397b-a17b"])
def test_gdn_on_amx_turns_off_prefix_caching_and_chunked_prefill(gdn_model):
    p = plan(hw(memory=2048 * GiB), model_name=gdn_model, max_model_len=4096)
    for name in ("enable_prefix_caching", "enable_chunked_prefill"):
        d = decision(p, f"engine.{name}")
        assert (d.value, d.source) == (False, "policy") and "Gated-DeltaNet" in d.reason
        assert p.engine_args[name] is False
    assert p.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "SD"


def test_gdn_on_amx_user_override_wins_with_a_warning():
    p = plan(
        hw(memory=2048 * GiB), model_name="qwen3-next-80b-a3b-instruct", max_model_len=4096, enable_prefix_caching=True
    )
    d = decision(p, "engine.enable_prefix_caching")
    assert (d.value, d.source) == (True, "user")
    assert any("enable_prefix_caching" in w for w in p.warnings)
    assert p.engine_args["enable_chunked_prefill"] is False


def test_gdn_conv_layout_already_set_is_left_alone():
    p = plan(
        hw(memory=2048 * GiB),
        model_name="qwen3-next-80b-a3b-instruct",
        max_model_len=4096,
        env={"VLLM_SSM_CONV_STATE_LAYOUT": "DS"},
    )
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in p.env
    assert decision(p, "env.VLLM_SSM_CONV_STATE_LAYOUT").source == "user"


def test_gdn_without_amx_keeps_vllm_defaults():
    p = plan(hw("xeon_8380_icelake.txt", 2048 * GiB), model_name="qwen3-next-80b-a3b-instruct", max_model_len=4096)
    assert p.engine_args["enable_prefix_caching"] is True
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in p.env


def test_dense_model_on_amx_keeps_prefix_caching():
    assert plan().engine_args["enable_prefix_caching"] is True


def test_mla_without_amx_notes_vllm_forcing_caching_off():
    p = plan(hw("xeon_8380_icelake.txt", 4096 * GiB), model_name="deepseek-v3", max_model_len=4096)
    d = decision(p, "engine.enable_prefix_caching")
    assert d.value is False and "MLA" in d.reason
    assert "enable_prefix_caching" not in p.engine_args


def test_zen_weight_prepack_default_on_and_configurable():
    p = plan(hw("epyc_9654_zen4.txt"))
    d = decision(p, "env.VLLM_ZENTORCH_WEIGHT_PREPACK")
    assert (p.backend.name, d.value, d.source) == ("zen", "1", "default")
    off = plan(hw("epyc_9654_zen4.txt"), zentorch_weight_prepack=False)
    assert off.env["VLLM_ZENTORCH_WEIGHT_PREPACK"] == "0"
    assert decision(off, "env.VLLM_ZENTORCH_WEIGHT_PREPACK").source == "user"


def test_no_prepack_variable_off_zen():
    assert "VLLM_ZENTORCH_WEIGHT_PREPACK" not in plan().env


def test_zen_maps_fp16_to_bf16_visibly():
    p = plan(hw("epyc_9654_zen4.txt"), dtype="float16")
    d = decision(p, "engine.dtype")
    assert (d.value, d.source) == ("bfloat16", "policy")
    assert any("float16" in w for w in p.warnings)


@pytest.mark.parametrize(
    "cpu,expected",
    [("xeon_8480_sapphirerapids.txt", "AMX"), ("epyc_9654_zen4.txt", "AVX-512 BF16")],
)
def test_bf16_where_native(cpu, expected):
    d = decision(plan(hw(cpu)), "engine.dtype")
    assert d.value == "bfloat16" and expected in d.reason


def test_dtype_on_a_class_without_a_measurement_says_so(monkeypatch):
    monkeypatch.delitem(MEASUREMENTS, "avx512")
    d = decision(plan(hw("xeon_8380_icelake.txt")), "engine.dtype")
    assert (d.value, d.source) == ("bfloat16", "policy")
    assert "avx512" in d.reason and "measured yet" in d.reason and "bench/parts/dtype.py" in d.reason


@pytest.mark.parametrize("cpu", ["epyc_zen1_kvm_avx2.txt", "epyc_7763_zen3.txt", "core_i7_12700k_alderlake.txt"])
def test_dtype_on_avx2_follows_the_measurement_of_its_class(cpu):
    measured = MEASUREMENTS["avx2"]
    d = decision(plan(hw(cpu, memory=128 * GiB), max_model_len=8192), "engine.dtype")
    assert d.value == ("float32" if measured.high < 1 else "bfloat16") and d.source == "policy"
    assert str(measured) in d.reason


@pytest.mark.parametrize("cpu", ["xeon_8380_icelake.txt", "xeon_emeraldrapids_kvm_nobf16.txt"])
def test_dtype_on_avx512_without_bf16_follows_the_measurement_of_its_class(cpu):
    measured = MEASUREMENTS["avx512"]
    d = decision(plan(hw(cpu, memory=128 * GiB), max_model_len=8192), "engine.dtype")
    assert d.value == ("float32" if measured.high < 1 else "bfloat16") and d.source == "policy"
    assert str(measured) in d.reason


def test_fp32_measured_faster_but_too_big_keeps_bf16_and_says_why(monkeypatch):
    monkeypatch.setitem(MEASUREMENTS, "avx2", Measurement("a test CPU", 0.5, 0.4, 0.6, "a test"))
    avx2 = hw("epyc_zen1_kvm_avx2.txt", memory=24 * GiB)  # the 8B model: 15 GiB in bf16, 30 GiB in fp32
    d = decision(plan(avx2, max_model_len=8192), "engine.dtype")
    assert d.value == "bfloat16" and "fp32 weights do not fit" in d.reason and "x0.50 [0.40, 0.60]" in d.reason
    roomy = decision(plan(hw("epyc_zen1_kvm_avx2.txt", memory=64 * GiB), max_model_len=8192), "engine.dtype")
    assert roomy.value == "float32"


def test_a_gdn_model_stays_bf16_on_avx2_since_its_prefill_kernel_runs_nothing_else():
    p = plan(hw("epyc_zen1_kvm_avx2.txt", memory=1024 * GiB), "qwen3-next-80b-a3b-instruct", max_model_len=8192)
    d = decision(p, "engine.dtype")
    assert d.value == "bfloat16" and "Gated-DeltaNet" in d.reason and not p.errors


def test_the_kv_cache_is_planned_for_the_weights_in_the_engine_dtype():
    bf16 = decision(plan(hw(memory=64 * GiB), max_model_len=8192, dtype="bfloat16"), "engine.kv_cache_memory_bytes")
    fp32 = decision(plan(hw(memory=64 * GiB), max_model_len=8192, dtype="float32"), "engine.kv_cache_memory_bytes")
    assert "weights 14.96 GiB" in bf16.reason and "weights 29.92 GiB" in fp32.reason


def test_user_dtype_wins():
    d = decision(plan(dtype="float32"), "engine.dtype")
    assert (d.value, d.source) == ("float32", "user")


def test_threads_emitted_as_vllm_and_openmp_settings():
    p = plan()
    assert p.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3|4-6"
    assert p.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert decision(p, "worker_env.OMP_PLACES").value == ["{0,1,2,3}", "{4,5,6}"]
    assert decision(p, "worker_env.OMP_PROC_BIND").value == ["true", "true"]
    assert p.engine_args["tensor_parallel_size"] == 2


def test_tp_override_is_a_user_decision():
    p = plan(tensor_parallel_size=1)
    d = decision(p, "engine.tensor_parallel_size")
    assert (d.value, d.source) == (1, "user")


def test_kv_cache_size_from_the_container_memory_limit():
    container = read_hardware(sysfs_root=SYSFS / "container_cpuset" / "sys")
    p = plan_engine(
        PlanInputs(container, model("qwen2.5-7b-instruct-gptq-int4"), software(), Settings(max_model_len=8192), {})
    )
    assert not p.errors
    d = decision(p, "engine.kv_cache_memory_bytes")
    assert d.source == "policy" and "16.00 GiB (cgroup memory.max)" in d.reason
    weights = model("qwen2.5-7b-instruct-gptq-int4").weight_bytes
    assert 0 < p.engine_args["kv_cache_memory_bytes"] < 16 * GiB - weights


def test_the_kv_cache_fits_in_what_is_free_at_start_not_in_the_whole_limit():
    """Memory other processes hold is not the engine's: vLLM refuses a KV cache larger than what is free."""
    whole = plan(
        hw(memory=24 * GiB), model_name="qwen2.5-7b-instruct-gptq-int4", max_model_len=4096, tensor_parallel_size=1
    )
    busy = hw(memory=24 * GiB)
    busy = dataclasses.replace(busy, limits=dataclasses.replace(busy.limits, memory_available_bytes=16 * GiB))
    shared = plan_engine(
        PlanInputs(
            busy,
            model("qwen2.5-7b-instruct-gptq-int4"),
            software(),
            Settings(max_model_len=4096, tensor_parallel_size=1),
            {},
        )
    )
    kv_whole, kv_shared = (p.engine_args["kv_cache_memory_bytes"] for p in (whole, shared))
    weights = model("qwen2.5-7b-instruct-gptq-int4").weight_bytes
    assert kv_shared == 16 * GiB - weights - default_headroom(24 * GiB) < kv_whole
    assert "16.00 GiB of it free at start" in decision(shared, "engine.kv_cache_memory_bytes").reason


def test_preflight_fails_before_loading_with_numbers():
    p = plan(hw(memory=24 * GiB), max_model_len=131072)
    assert p.errors
    error = p.errors[0]
    assert "needs" in error and "limit is 24.00 GiB" in error and "a max context of" in error
    fits = int(error.split("a max context of ")[1].split()[0])
    assert 0 < fits < 131072
    assert not plan(hw(memory=24 * GiB), max_model_len=fits).errors


def test_preflight_fails_when_weights_alone_do_not_fit():
    p = plan(hw(memory=8 * GiB), max_model_len=1024)
    assert p.errors and "does not fit" in p.errors[0]


def test_user_kv_cache_too_small_for_one_request_is_an_error():
    p = plan(kv_cache_gib=0.1, max_model_len=8192)
    assert p.errors and "kv_cache_gib" in p.errors[0]


def test_backend_refusal_stops_the_plan():
    """No engine setting is planned past a refused backend; who may call the port is still shown."""
    p = plan(hw("graviton3_neoverse_v1.txt"))
    assert p.backend.name is None and p.errors and not p.engine_args and not p.env
    assert [d.setting for d in p.decisions] == ["access.api_key"]


def test_legacy_kvcache_env_is_respected_and_reported():
    p = plan(env={"VLLM_CPU_KVCACHE_SPACE": "40"})
    assert "kv_cache_memory_bytes" not in p.engine_args
    assert decision(p, "env.VLLM_CPU_KVCACHE_SPACE").source == "user"


def test_no_model_still_decides_threads():
    p = plan(model_name=None)
    assert "VLLM_CPU_OMP_THREADS_BIND" in p.env and "dtype" not in p.engine_args


def test_trust_remote_code_off_by_default():
    assert plan().engine_args["trust_remote_code"] is False


def test_a_context_past_the_models_positions_is_warned_about_before_start():
    p = plan(model_name="llama-3.1-8b-instruct", max_model_len=10**6)
    assert decision(p, "engine.max_model_len").value == 10**6
    assert any(
        "past the model's max_position_embeddings" in w and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in w for w in p.warnings
    )
    within = plan(model_name="llama-3.1-8b-instruct", max_model_len=4096)
    assert not any("max_position_embeddings" in w for w in within.warnings)


def test_the_bytes_a_decode_step_reads_are_decided_in_the_engine_dtype_and_cited_by_the_kernel():
    from service.facts.model import DecodeReads

    facts = dataclasses.replace(
        model("qwen2.5-7b-instruct-gptq-int4"),
        decode_reads=DecodeReads(float_elements=1_000_000, packed_bytes=3_000_000),
    )
    p = plan_engine(PlanInputs(hw(), facts, software(True), Settings(), {}))
    reads = decision(p, "model.read_per_token")
    dtype = decision(p, "engine.dtype").value
    assert reads.value == 3_000_000 + 1_000_000 * {"bfloat16": 2, "float32": 4}[dtype]
    assert f"in {dtype}" in reads.reason and "3.0 MB of quantized values" in reads.reason
    assert decision(p, "quant.linear_kernel").reason.endswith(
        f"reads {reads.value / 1e6:.1f} MB of weights per decode token (model.read_per_token)"
    )
    unknown = plan_engine(
        PlanInputs(hw(), dataclasses.replace(facts, decode_reads=None), software(True), Settings(), {})
    )
    assert unknown.find("model.read_per_token") is None


def test_a_kernel_that_holds_quantized_layers_as_blocks_is_read_in_its_block_bytes():
    """ggml's Q4_0 holds 32 int4 weights and their scale in 18 bytes, whatever the checkpoint's group size: the read
    ceiling counts those, not the checkpoint's tensors; vLLM's own kernels read the tensors as stored."""
    from service.facts.model import DecodeReads
    from service.kernels.registry import KERNELS

    reads = DecodeReads(
        float_elements=1_000_000,
        packed_bytes=3_000_000,
        quantized_weights=5_000_000,
        quantized_packed_bytes=2_600_000,
        quantized_float_elements=40_000,
    )
    facts = dataclasses.replace(model("qwen2.5-7b-instruct-gptq-int4"), decode_reads=reads)
    avx2 = hw("epyc_zen1_kvm_avx2.txt")
    for kernels, blocks in (("ggml built from llama.cpp b1234", True), (None, False)):
        p = plan_engine(PlanInputs(avx2, facts, software(False, ggml_kernel=kernels), Settings(), {}))
        kernel = decision(p, "quant.linear_kernel").value
        dtype_bytes = {"bfloat16": 2, "float32": 4}[decision(p, "engine.dtype").value]
        read = decision(p, "model.read_per_token")
        assert (KERNELS[kernel].block_bytes is not None) == blocks, kernel
        if blocks:
            assert read.value == 400_000 + 960_000 * dtype_bytes + 5_000_000 * KERNELS[kernel].block_bytes // 32
            assert f"5.0 M quantized weights as {kernel} holds them" in read.reason
        else:
            assert read.value == reads.bytes_in(dtype_bytes) and "3.0 MB of quantized values" in read.reason


def test_the_users_own_thread_binding_reaches_vllm_as_theirs():
    mine = decision(
        plan(hw("build_machine.txt"), env={"VLLM_CPU_OMP_THREADS_BIND": "1"}), "env.VLLM_CPU_OMP_THREADS_BIND"
    )
    assert (mine.value, mine.source) == ("1", "user") and "the service's plan would bind 0" in mine.reason
    ours = decision(plan(hw("build_machine.txt")), "env.VLLM_CPU_OMP_THREADS_BIND")
    assert (ours.value, ours.source) == ("0", "policy")
    refused = plan(hw("build_machine.txt"), env={"VLLM_CPU_OMP_THREADS_BIND": "2"})
    assert any("names CPU(s) 2 outside the allowed CPUs 0-1" in e for e in refused.errors), refused.errors
