"""The calibration's questions (which speed decisions it times, with which candidates) and its verdicts on recorded
timings: a resolved win, a tie, a crash, a wrong result, a table choice that did not run; and how a verdict reaches
the plan (never over a user's setting)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from service.facts.model import inspect_model
from service.policy.plan.calibration import Candidate, Question, Timing, Verdict, cache_key, decide
from service.policy.plan.plan import plan_engine
from service.policy.plan.plan_state import PlanInputs
from service.settings import load_settings
from tests.unit.conftest import software
from tests.unit.policy.test_policy_engine import decision, hw
from tests.unit.policy.test_quant_policy import AMX, AVX2, AVX512, W4A16, W8A8_DYNAMIC, ZEN, GiB, ct_config

GPTQ = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False},
}


def plan_for(config: dict, cpu: str, tmp_path, verdicts=None, auto_round_lib="0.16.0", ggml_kernel=None, **settings):
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2}
    (d / "config.json").write_text(json.dumps({**base, "max_position_embeddings": 4096, **config}))
    return plan_engine(
        PlanInputs(
            hw(cpu, memory=256 * GiB),
            inspect_model(str(d)),
            software(True, auto_round_lib, ggml_kernel),
            load_settings(**settings),
            {},
            verdicts=verdicts,
        )
    )


QUESTION = Question(
    "int4_kernel",
    "a",
    (Candidate("a", {"int4_kernel": "vllm"}, "k-a"), Candidate("b", {"int4_kernel": "auto-round"}, "k-b")),
    ((4096, 6144),),
    "int4",
)


def rounds(ms: float, spread: float = 0.01, n: int = 7) -> tuple[float, ...]:
    return tuple(ms * 1e-3 * (1 + spread * ((i % 3) - 1)) for i in range(n))


def test_a_faster_candidate_with_a_resolved_margin_replaces_the_table():
    v = decide(QUESTION, (Timing("a", rounds(2.0), rounds(20)), Timing("b", rounds(1.0), rounds(30))))
    assert (v.chosen, dict(v.settings)) == ("b", {"int4_kernel": "auto-round"})
    assert "b is faster than the table's a here: decode x2.00 [" in v.reason
    assert "a: decode 2.00 ms, prefill 20.0 ms per pass" in v.reason and "b: decode 1.00 ms" in v.reason


def test_a_margin_inside_the_interval_keeps_the_table():
    noisy_a = (2.0e-3, 1.0e-3, 2.2e-3, 0.9e-3, 2.1e-3)
    noisy_b = (1.0e-3, 2.0e-3, 0.9e-3, 2.1e-3, 0.95e-3)
    v = decide(QUESTION, (Timing("a", noisy_a, noisy_a), Timing("b", noisy_b, noisy_b)))
    assert (v.chosen, dict(v.settings)) == ("a", {})
    assert "does not resolve the margin, so the table's stands" in v.reason


def test_an_exact_tie_keeps_the_table():
    v = decide(QUESTION, (Timing("a", rounds(1.0), rounds(10)), Timing("b", rounds(1.0), rounds(10))))
    assert (v.chosen, dict(v.settings)) == ("a", {})


def test_a_crashed_or_wrong_candidate_is_excluded_and_named():
    crashed = Timing("b", error="crashed the timing process (exit -11)")
    v = decide(QUESTION, (Timing("a", rounds(2.0), rounds(20)), crashed))
    assert (v.chosen, dict(v.settings)) == ("a", {})
    assert "b: excluded (crashed the timing process (exit -11))" in v.reason
    wrong = Timing("b", rounds(0.5), rounds(5), error="wrong results: max error 0.900", max_rel_err=0.9)
    assert decide(QUESTION, (Timing("a", rounds(2.0), rounds(20)), wrong)).chosen == "a"


def test_when_the_tables_choice_did_not_run_the_fastest_that_did_is_taken():
    v = decide(QUESTION, (Timing("a", error="RuntimeError: no op"), Timing("b", rounds(3.0), rounds(30))))
    assert (v.chosen, dict(v.settings)) == ("b", {"int4_kernel": "auto-round"})
    assert "the table's a did not run here" in v.reason


def test_nothing_ran_keeps_the_table():
    v = decide(QUESTION, (Timing("a", error="x"), Timing("b", error="y")))
    assert (v.chosen, dict(v.settings)) == ("a", {}) and "no candidate ran" in v.reason


@pytest.mark.parametrize(
    ("cpu", "expected", "default"),
    [
        (ZEN, {"vllm-weight-only", "vllm-w4a8", "auto-round"}, "vllm-weight-only"),
        (AMX, {"vllm-weight-only", "vllm-w4a8", "auto-round"}, "vllm-w4a8"),
        (AVX512, {"vllm", "auto-round"}, "auto-round"),
    ],
)
def test_an_int4_checkpoint_asks_which_kernel_with_what_each_candidate_runs(tmp_path, cpu, expected, default):
    p = plan_for(W4A16, cpu, tmp_path)
    (q,) = p.questions
    assert (q.decision, q.default, q.weights, q.group_size) == ("int4_kernel", default, "int4", 128)
    assert {c.name for c in q.candidates} == expected
    for c in q.candidates:
        # each candidate runs what the policy plans when its settings are set
        user = plan_for(W4A16, cpu, tmp_path, **c.settings)
        assert decision(user, "quant.linear_kernel").value == c.kernel
        assert {k: v for k, v in user.env.items() if k in c.env} == dict(c.env)
    assert (4096, 6144) in q.shapes and len(set(q.shapes)) == len(q.shapes)


def test_no_question_where_there_is_no_choice_or_the_user_made_it(tmp_path):
    assert plan_for(W4A16, AVX2, tmp_path).questions == ()  # the service's kernel is the only one there
    assert plan_for(W4A16, AVX512, tmp_path, auto_round_lib=None).questions == ()  # vLLM's alone
    assert plan_for(W4A16, ZEN, tmp_path, int4_kernel="vllm").questions == ()
    assert plan_for(W8A8_DYNAMIC, AVX512, tmp_path).questions == ()  # oneDNN's int8 kernel alone
    # Without VNNI oneDNN's int8 kernel saturates: ggml's exact one is not weighed against it
    assert plan_for(W8A8_DYNAMIC, AVX2, tmp_path, ggml_kernel="ggml 0.3.36").questions == ()
    assert plan_for(W8A8_DYNAMIC, ZEN, tmp_path, w8a8_zentorch=True).questions == ()
    (q,) = plan_for(W4A16, ZEN, tmp_path, int4_w4a8=False).questions  # the user's w4a8 choice stays
    assert {c.name for c in q.candidates} == {"vllm", "auto-round"}
    assert plan_for(GPTQ, AVX512, tmp_path).questions[0].layout == "gptq"


def test_a_verdict_reaches_the_plan_as_a_calibration_decision(tmp_path):
    (q,) = plan_for(W4A16, ZEN, tmp_path).questions
    winner = next(c for c in q.candidates if c.name == "auto-round")
    verdict = Verdict("int4_kernel", winner.name, winner.settings, "auto-round is faster here: decode x1.50", ())
    p = plan_for(W4A16, ZEN, tmp_path, verdicts={"int4_kernel": verdict})
    kernel = decision(p, "quant.linear_kernel")
    assert (kernel.value, kernel.source) == ("auto-round", "calibration")
    assert p.env["SERVICE_LINEAR_KERNELS"] == "ArkWNA16LinearKernel"
    record = decision(p, "calibration.int4_kernel")
    assert (record.value, record.reason) == ("auto-round", verdict.reason)
    w4a8 = next(c for c in q.candidates if c.name == "vllm-w4a8")
    p = plan_for(
        W4A16, ZEN, tmp_path, verdicts={"int4_kernel": Verdict("int4_kernel", "vllm-w4a8", w4a8.settings, "r", ())}
    )
    assert (decision(p, "quant.linear_kernel").value, p.env["VLLM_CPU_INT4_W4A8"]) == ("zentorch-da8w4", "1")
    assert decision(p, "env.VLLM_CPU_INT4_W4A8").source == "calibration"


def test_a_users_setting_is_never_overridden_by_a_verdict(tmp_path):
    verdict = Verdict("int4_kernel", "auto-round", {"int4_kernel": "auto-round"}, "faster", ())
    p = plan_for(W4A16, ZEN, tmp_path, verdicts={"int4_kernel": verdict}, int4_kernel="vllm", int4_w4a8=False)
    kernel = decision(p, "quant.linear_kernel")
    assert (kernel.value, kernel.source) == ("zentorch-woq", "user")


def test_the_cache_key_follows_the_machine_and_the_question():
    machine = {"cpu": ["AuthenticAMD", "AMD EPYC", 25, 17, 1, ["avx2"]], "compute_cpus": [0], "software": ["x"]}
    key = cache_key(machine, (QUESTION,))
    assert key == cache_key(dict(machine), (QUESTION,))
    assert key != cache_key({**machine, "compute_cpus": [0, 1]}, (QUESTION,))
    other = Question("int4_kernel", "a", QUESTION.candidates, ((4096, 4096),), "int4")
    assert key != cache_key(machine, (other,))


@pytest.mark.parametrize("cpu", [ZEN, AMX, AVX512])
def test_an_awq_checkpoint_is_timed_in_its_own_layout(tmp_path, cpu):
    awq = dict(GPTQ, quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    (q,) = plan_for(awq, cpu, tmp_path).questions
    assert (q.decision, q.layout, q.symmetric, q.group_size) == ("int4_kernel", "awq", False, 128)
    assert "auto-round" in {c.name for c in q.candidates}
    # zero_point=false: vLLM's AWQ path still hands its kernels zero points, which the timing does not build
    sym = dict(awq, quantization_config=dict(awq["quantization_config"], zero_point=False))
    assert plan_for(sym, cpu, tmp_path).questions == ()


def test_an_8_bit_weight_only_checkpoint_is_not_calibrated(tmp_path):
    w8 = ct_config({"num_bits": 8, "strategy": "channel"})
    assert plan_for(w8, ZEN, tmp_path).questions == ()


LLAMA_BF16 = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


def test_without_native_bf16_the_dtype_is_asked_and_a_verdict_sets_it(tmp_path):
    p = plan_for(LLAMA_BF16, AVX2, tmp_path)
    (q,) = p.questions
    table = decision(p, "engine.dtype").value
    assert (q.decision, q.default, q.weights) == ("dtype", table, "dense")
    assert {c.name for c in q.candidates} == {"bfloat16", "float32"}
    assert set(q.shapes) == {(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)}
    other = next(c for c in q.candidates if c.name != table)
    verdict = Verdict("dtype", other.name, other.settings, "faster here", ())
    d = decision(plan_for(LLAMA_BF16, AVX2, tmp_path, verdicts={"dtype": verdict}), "engine.dtype")
    assert (d.value, d.source) == (other.name, "calibration")
    user = plan_for(LLAMA_BF16, AVX2, tmp_path, verdicts={"dtype": verdict}, dtype=table)
    assert (decision(user, "engine.dtype").value, user.questions) == (table, ())


@pytest.mark.parametrize("cpu", [AVX2, "xeon_8380_icelake.txt", "xeon_emeraldrapids_kvm_nobf16.txt"])
def test_each_dtype_candidate_times_the_linear_kernel_its_engine_would_run(tmp_path, cpu):
    """With the service's kernels built, each dtype candidate carries what the dense-kernel policy plans for an
    engine in that dtype (its bf16 kernel, or vLLM's GEMM), so the calibration times what the engine runs."""
    built = "ggml from llama-cpp-python 0.3.36"
    for bf16_weights in ("auto", "on", "off"):
        user = {} if bf16_weights == "auto" else {"bf16_weights": bf16_weights}
        (q,) = plan_for(LLAMA_BF16, cpu, tmp_path, ggml_kernel=built, **user).questions
        for c in q.candidates:
            engine = plan_for(LLAMA_BF16, cpu, tmp_path, ggml_kernel=built, dtype=c.name, **user)
            runs = decision(engine, "engine.linear_weights").value
            assert "the service's kernel" in runs or runs == "bf16" or "vLLM's GEMM" in runs or runs == "fp32"
            ours = runs in ("bf16", "bf16, the service's kernel")
            assert dict(c.env) == ({"SERVICE_LINEAR_KERNELS": "Bf16WeightsLinear"} if ours else {}), (c.name, runs)
    # Without the build every candidate runs vLLM's GEMM.
    (q,) = plan_for(LLAMA_BF16, cpu, tmp_path).questions
    assert [dict(c.env) for c in q.candidates] == [{}, {}]


def test_native_bf16_asks_no_dtype_and_zen_asks_about_zentorchs_prepack(tmp_path):
    assert all(q.decision != "dtype" for q in plan_for(LLAMA_BF16, ZEN, tmp_path).questions)
    assert plan_for(LLAMA_BF16, AMX, tmp_path).questions == ()
    q, _ = plan_for(LLAMA_BF16, ZEN, tmp_path).questions
    assert (q.decision, q.default) == ("zentorch_weight_prepack", "prepacked")
    assert {c.name: dict(c.env) for c in q.candidates} == {
        "prepacked": {"VLLM_ZENTORCH_WEIGHT_PREPACK": "1"},
        "not-prepacked": {"VLLM_ZENTORCH_WEIGHT_PREPACK": "0"},
    }
    off = next(c for c in q.candidates if c.name == "not-prepacked")
    verdict = Verdict("zentorch_weight_prepack", off.name, off.settings, "faster here", ())
    p = plan_for(LLAMA_BF16, ZEN, tmp_path, verdicts={"zentorch_weight_prepack": verdict})
    d = decision(p, "env.VLLM_ZENTORCH_WEIGHT_PREPACK")
    assert (d.value, d.source, p.env["VLLM_ZENTORCH_WEIGHT_PREPACK"]) == ("0", "calibration", "0")
    user = plan_for(
        LLAMA_BF16, ZEN, tmp_path, verdicts={"zentorch_weight_prepack": verdict}, zentorch_weight_prepack=True
    )
    assert user.env["VLLM_ZENTORCH_WEIGHT_PREPACK"] == "1"
    assert [q.decision for q in user.questions] == ["backend"]


def test_zen_asks_zentorch_or_vllms_generic_kernels_and_a_verdict_lowers_the_backend(tmp_path):
    p = plan_for(LLAMA_BF16, ZEN, tmp_path)
    q = next(q for q in p.questions if q.decision == "backend")
    assert (q.default, q.weights, q.act_dtype, q.min_gain) == ("zen", "dense", "bfloat16", 1.10)
    zen, generic = q.candidates
    assert (zen.name, dict(zen.env), dict(zen.process_env)) == ("zen", {"VLLM_ZENTORCH_WEIGHT_PREPACK": "1"}, {})
    # The lowering is timed in a process started as its engine would be: vLLM's generic platform, its own preloads.
    lowered = plan_for(LLAMA_BF16, ZEN, tmp_path, backend="avx512")
    assert (generic.name, dict(generic.process_env)) == ("avx512", lowered.env)
    assert generic.process_env["SERVICE_VLLM_PLATFORM"] == "vllm.platforms.cpu.CpuPlatform"
    verdict = Verdict("backend", "avx512", generic.settings, "faster here", ())
    chosen = plan_for(LLAMA_BF16, ZEN, tmp_path, verdicts={"backend": verdict})
    assert (chosen.backend.name, chosen.backend.requested) == ("avx512", "auto")
    assert "calibrated on this machine" in chosen.backend.reason
    assert decision(chosen, "env.SERVICE_VLLM_PLATFORM").source == "calibration"
    assert chosen.env["SERVICE_VLLM_PLATFORM"] == lowered.env["SERVICE_VLLM_PLATFORM"]
    assert "VLLM_ZENTORCH_WEIGHT_PREPACK" not in chosen.env
    assert decision(chosen, "calibration.backend").value == "avx512"
    # Never over the user's backend; never for a quantized model (its kernels are their own question); only on a
    # backend with a lowering.
    user = plan_for(LLAMA_BF16, ZEN, tmp_path, verdicts={"backend": verdict}, backend="zen")
    assert user.backend.name == "zen" and all(q.decision != "backend" for q in user.questions)
    assert all(q.decision != "backend" for q in plan_for(W8A8_DYNAMIC, ZEN, tmp_path).questions)
    for cpu in (AMX, AVX512, AVX2):
        assert all(q.decision != "backend" for q in plan_for(LLAMA_BF16, cpu, tmp_path).questions)


def test_zen_w8a8_asks_zentorch_or_onednn_and_a_verdict_sets_the_kernel(tmp_path):
    (q,) = plan_for(W8A8_DYNAMIC, ZEN, tmp_path).questions
    assert (q.decision, q.default, q.weights) == ("w8a8_kernel", "zentorch", "int8")
    assert {c.name: c.kernel for c in q.candidates} == {"zentorch": "zentorch-w8a8", "onednn": "onednn-w8a8"}
    onednn = next(c for c in q.candidates if c.name == "onednn")
    assert onednn.env == {"VLLM_DISABLED_KERNELS": "ZentorchInt8ScaledMMLinearKernel"}
    verdict = Verdict("w8a8_kernel", "onednn", onednn.settings, "faster here", ())
    p = plan_for(W8A8_DYNAMIC, ZEN, tmp_path, verdicts={"w8a8_kernel": verdict})
    kernel = decision(p, "quant.linear_kernel")
    assert (kernel.value, kernel.source) == ("onednn-w8a8", "calibration")
    assert p.env["VLLM_DISABLED_KERNELS"] == "ZentorchInt8ScaledMMLinearKernel"
    user = plan_for(W8A8_DYNAMIC, ZEN, tmp_path, verdicts={"w8a8_kernel": verdict}, w8a8_zentorch=True)
    assert (decision(user, "quant.linear_kernel").value, decision(user, "quant.linear_kernel").source) == (
        "zentorch-w8a8",
        "user",
    )


def test_w8a8_weighs_the_services_ggml_kernel_where_it_is_built(tmp_path):
    built = "ggml from llama-cpp-python 0.3.36"
    (q,) = plan_for(W8A8_DYNAMIC, AVX512, tmp_path, ggml_kernel=built).questions
    assert (q.decision, q.default) == ("w8a8_kernel", "vllm")
    assert {c.name: c.kernel for c in q.candidates} == {"vllm": "onednn-w8a8", "ggml": "ggml-q8_0"}
    ggml = next(c for c in q.candidates if c.name == "ggml")
    assert ggml.env["SERVICE_LINEAR_KERNELS"] == "GgmlInt8LinearKernel"
    (zen,) = plan_for(W8A8_DYNAMIC, ZEN, tmp_path, ggml_kernel=built).questions
    assert {c.name for c in zen.candidates} == {"zentorch", "onednn", "ggml"} and zen.default == "zentorch"
    verdict = Verdict("w8a8_kernel", "ggml", ggml.settings, "faster here", ())
    p = plan_for(W8A8_DYNAMIC, ZEN, tmp_path, verdicts={"w8a8_kernel": verdict}, ggml_kernel=built)
    kernel = decision(p, "quant.linear_kernel")
    assert (kernel.value, kernel.source) == ("ggml-q8_0", "calibration")
    assert p.env["SERVICE_LINEAR_KERNELS"] == "GgmlInt8LinearKernel"
    (theirs,) = plan_for(W8A8_DYNAMIC, ZEN, tmp_path, ggml_kernel=built, int8_kernel="vllm").questions
    assert {c.name for c in theirs.candidates} == {"zentorch", "onednn"}
    assert plan_for(W8A8_DYNAMIC, AVX512, tmp_path, ggml_kernel=built, int8_kernel="ggml").questions == ()


def test_a_backend_switch_must_win_by_more_than_a_resolved_margin():
    question = dataclasses.replace(QUESTION, decision="backend", min_gain=1.10)
    small = decide(question, (Timing("a", rounds(1.05), rounds(10)), Timing("b", rounds(1.0), rounds(10))))
    assert small.chosen == "a" and "is not surely above the x1.10 this decision must win by" in small.reason
    large = decide(question, (Timing("a", rounds(1.5), rounds(10)), Timing("b", rounds(1.0), rounds(10))))
    assert large.chosen == "b"


def test_when_the_table_wins_its_lead_is_cited_with_its_interval():
    v = decide(QUESTION, (Timing("a", rounds(1.0), rounds(10)), Timing("b", rounds(2.0), rounds(20))))
    assert (v.chosen, dict(v.settings)) == ("a", {})
    assert "the table's a measured fastest here, ahead of b by decode x2.00 [" in v.reason


def test_a_candidate_that_fails_on_a_bare_assert_is_excluded_with_where_it_failed():
    from service.startup.calibration_timer import _why

    try:
        raise AssertionError  # what vLLM's kernels raise on an unmet `assert`: no message
    except AssertionError as exc:
        why = _why(exc)
    assert why.startswith("AssertionError: at test_calibration.py:") and why.rsplit(":", 1)[1].isdigit()
    assert _why(ValueError("no such dtype")) == "ValueError: no such dtype"


def test_stored_timings_are_keyed_by_the_harness_that_took_them(tmp_path, monkeypatch):
    """A mended timing harness times again rather than reuse what the old one measured (or failed to build)."""
    from service.startup import build_report
    from service.startup import calibration_run as calibrate
    from tests.unit.conftest import CPUINFO

    report = build_report(load_settings(), model=None, cpuinfo=CPUINFO / "build_machine.txt", environ={})
    before = calibrate.machine(report)
    harness = tmp_path / "timing.py"
    harness.write_bytes(calibrate.HARNESS.read_bytes() + b"# mended\n")
    monkeypatch.setattr(calibrate, "HARNESS", harness)
    after = calibrate.machine(report)
    assert before["harness"] != after["harness"] and {**before, "harness": None} == {**after, "harness": None}
