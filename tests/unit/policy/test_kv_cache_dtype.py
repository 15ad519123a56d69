"""The KV cache's element type: the setting, where vLLM's CPU attention can store fp8 (recorded CPUs, model shapes),
and the tokens the memory plan then gives the cache."""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

from service.__main__ import app
from service.facts.hardware import read_hardware
from service.facts.model import inspect_model
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.server.supervision.engine_start import vllm_args
from service.settings import Settings
from tests.unit.conftest import CPUINFO, MODELS, software

GiB = 1024**3


def _plan(cpu="xeon_8480_sapphirerapids.txt", model="llama-3.1-8b-instruct", facts=None, **settings):
    hardware = read_hardware(cpuinfo_path=CPUINFO / cpu)
    hardware = dataclasses.replace(hardware, limits=dataclasses.replace(hardware.limits, memory_bytes=64 * GiB))
    return plan_engine(
        PlanInputs(hardware, facts or inspect_model(str(MODELS / model)), software(), Settings(**settings), {})
    )


def _decision(plan, setting):
    return next(d for d in plan.decisions if d.setting == setting)


def _tokens(plan) -> int:
    return int(re.search(r"holds (\d+) tokens", _decision(plan, "engine.kv_cache_memory_bytes").reason)[1])


@pytest.mark.parametrize("cpu", sorted(p.name for p in CPUINFO.glob("*.txt")))
def test_fp8_is_stored_exactly_where_vllms_cpu_attention_can(cpu):
    """vLLM 0.32's cpu_attn: x86 with AVX-512 or AMX tiles; every other CPU is refused before the engine starts."""
    if _plan(cpu).errors:  # a CPU the service does not serve at all (no backend): nothing more to refuse
        assert _plan(cpu, kv_cache_dtype="fp8").errors
        return
    isa = read_hardware(cpuinfo_path=CPUINFO / cpu).cpu.isa
    plan = _plan(cpu, kv_cache_dtype="fp8")
    if isa.avx512 or isa.amx_tile:
        assert not plan.errors, plan.errors
        d = _decision(plan, "engine.kv_cache_dtype")
        assert (d.value, d.source) == ("fp8_e4m3", "user") and "measured on SmolLM2-135M" in d.reason
        assert plan.engine_args["kv_cache_dtype"] == "fp8_e4m3"
    else:
        assert plan.errors == (
            "kv_cache_dtype=fp8: vLLM's CPU attention stores an fp8 KV cache only on x86 CPUs "
            "with AVX-512 or AMX, and this one has neither",
        ), plan.errors


def test_auto_caches_in_the_model_dtype_and_says_so():
    d = _decision(_plan(dtype="bfloat16"), "engine.kv_cache_dtype")
    assert (d.value, d.source) == ("auto", "default") and "bfloat16" in d.reason and "no quality cost" in d.reason


@pytest.mark.parametrize("cpu", sorted(p.name for p in CPUINFO.glob("*.txt")))
def test_the_kv_type_kept_says_what_a_value_takes_and_what_a_smaller_one_would_cost_or_why_there_is_none(cpu):
    """At agent depth a decode step reads the whole cache: the reason compares it with llama.cpp's f16 cache and
    names the alternative this CPU has (fp8, with its measured quality cost) or why it has none."""
    plan = _plan(cpu)
    if plan.errors:
        return
    d = _decision(plan, "engine.kv_cache_dtype")
    dtype = plan.engine_args["dtype"]
    assert d.value == "auto" and f"the model dtype ({dtype}" in d.reason
    assert ("twice the bytes of llama.cpp's default f16 cache" in d.reason) == (dtype == "float32")
    isa = read_hardware(cpuinfo_path=CPUINFO / cpu).cpu.isa
    if isa.avx512 or isa.amx_tile:
        assert "fp8 (kv_cache_dtype=fp8, 1 byte a value) is left to the user" in d.reason
        assert "measured: claim/kv-fp8-cost/" in d.reason
        # the AMX kernel's speed at depth is measured (the bf16 engine on AMX); the vec kernel's is said to be not
        amx = isa.amx and dtype == "bfloat16"
        assert ("measured: depth/xeon-amx/1.5b-q4_0-gguf/16384/decode-kv-fp8" in d.reason) == amx
        assert ("16k tokens against this cache: not measured on this kernel" in d.reason) == (not amx)
    else:
        assert "no smaller type here: vLLM's CPU attention stores an fp8 KV cache only on x86 CPUs" in d.reason
        # the one smaller cache there is bf16 as the model dtype: measured at depth against the fp32 engine's
        bf16 = "measured: depth/zen1/smollm2-q4_1/8000/decode-dtype-bfloat16" in d.reason
        assert bf16 == (dtype == "float32"), d.reason


@pytest.mark.parametrize(("dtype", "times"), [("bfloat16", 2), ("float32", 4)])
def test_fp8_gives_the_same_memory_twice_or_four_times_the_tokens(dtype, times):
    plain = _plan(dtype=dtype, max_model_len=8192)
    fp8 = _plan(dtype=dtype, max_model_len=8192, kv_cache_dtype="fp8_e5m2")
    assert fp8.engine_args["kv_cache_memory_bytes"] == plain.engine_args["kv_cache_memory_bytes"]
    assert abs(_tokens(fp8) - times * _tokens(plain)) <= times, (_tokens(fp8), _tokens(plain))
    assert _decision(fp8, "engine.kv_cache_dtype").value == "fp8_e5m2"


def test_the_cost_named_is_the_kernel_the_dtype_runs_on():
    amx = _decision(_plan(dtype="bfloat16", kv_cache_dtype="fp8"), "engine.kv_cache_dtype").reason
    vec = _decision(_plan(dtype="float32", kv_cache_dtype="fp8"), "engine.kv_cache_dtype").reason
    assert "measured: claim/kv-fp8-cost/amx" in amx and "measured: claim/kv-fp8-cost/vec" in vec


def test_a_model_whose_heads_vllm_cannot_store_in_fp8_is_refused_naming_them():
    llama = inspect_model(str(MODELS / "llama-3.1-8b-instruct"))
    plan = _plan(facts=dataclasses.replace(llama, head_dim=80), kv_cache_dtype="fp8")
    assert any("head sizes divisible by 32" in e and "is 80" in e for e in plan.errors), plan.errors
    mla = _plan(model="deepseek-v3", kv_cache_dtype="fp8")
    assert any("MLA attention stores the KV cache in the model dtype only" in e for e in mla.errors), mla.errors


def test_the_setting_reaches_vllms_own_argument():
    assert vllm_args({"kv_cache_dtype": "fp8_e4m3"}, "m", "m", 0).kv_cache_dtype == "fp8_e4m3"


def test_the_setting_from_env_and_flag_and_a_bad_value(monkeypatch):
    monkeypatch.setenv("SERVICE_KV_CACHE_DTYPE", "fp8")
    assert Settings().kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        Settings(kv_cache_dtype="int8")
    refused = CliRunner().invoke(
        app, ["detect", "--cpuinfo", str(CPUINFO / "epyc_7763_zen3.txt"), "--kv-cache-dtype", "fp8_e4m3"]
    )
    assert refused.exit_code == 1 and "AVX-512 or AMX" in refused.stdout, refused.stdout
