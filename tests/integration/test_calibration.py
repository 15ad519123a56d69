"""The calibration on the live CPU, whatever it is: `detect --calibrate` times the int4 kernels' candidates for the
W4A16 demo model within its bound, a second run reuses the stored timings, and a server started on the same cache
runs the kernel the calibration chose (read back from the engine's log); likewise the backend where it has a
lowering (Zen), read back from every vLLM process."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from harness.quantized_models import quantized_demo
from service.kernels.registry import KERNELS
from service.models.demo_model import ensure_demo_model
from service.policy.machine.backends import ZEN_PLATFORM
from tests.support.release import release
from tests.support.server import MODELS, REPO, process_states, service_env, start_service

pytestmark = pytest.mark.engine

BOUND_S = 60  # ~10-20 s on a 2-core guest for the demo model; a loaded CI machine gets slack


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    """Two `detect --calibrate` runs on one fresh cache: (env, first, second), each (report, stderr)."""
    cache = tmp_path_factory.mktemp("calibration-cache")
    env = service_env(cache, model=str(quantized_demo(MODELS, "w4a16")), calibrate="auto")
    return cache, env, [_detect_calibrate(env) for _ in range(2)]


def _detect_calibrate(env: dict) -> tuple[dict, str]:
    """`python -m service detect --calibrate --json`: the report, and what it logged."""
    out = subprocess.run(
        [sys.executable, "-m", "service", "detect", "--calibrate", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout), out.stderr


def _start_calibrated(server_logs, name: str, cache, model: str):
    """A server on `cache`, where `detect --calibrate` stored its timings (a warm start reads them)."""
    return start_service(
        server_logs / f"{name.replace('/', '-')}.log",
        extra_env={"SERVICE_CACHE_DIR": str(cache)},
        name=name,
        model=model,
        kv_cache_gib="0.25",
        calibrate="auto",
    )


def _decided(report: dict) -> dict:
    return {d["setting"]: d for d in report["decisions"]}


def _question(env: dict) -> dict | None:
    """The live CPU's int4 question, as the service asks it (None where it has one int4 kernel, e.g. AVX2)."""
    return next((q for q in _questions(env) if q["decision"] == "int4_kernel"), None)


def _questions(env: dict) -> list[dict]:
    """The questions the service asks for this environment's model on the live CPU."""
    probe = (
        "import dataclasses, json; from service.settings import Settings; "
        "from service.startup import build_report; from service.startup.model_sources import choose_model; "
        "s = Settings(); "
        "q = build_report(s, model=choose_model(s, build_demo=False)).plan.questions; "
        "print(json.dumps([dataclasses.asdict(x) for x in q]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_detect_calibrates_within_its_bound_and_a_warm_run_times_nothing(calibration):
    cache, env, ((first, first_log), (second, second_log)) = calibration
    question = _question(env)
    if question is None:  # one int4 kernel on this CPU: nothing to time, nothing stored
        assert "calibration.int4_kernel" not in _decided(first) and not (cache / "calibration").exists()
        return
    verdict = _decided(first)["calibration.int4_kernel"]
    assert verdict["source"] == "calibration"
    for candidate in question["candidates"]:
        assert f"{candidate['name']}: " in verdict["reason"]  # each candidate's timings, or why it was excluded
    assert verdict["value"] in {c["name"] for c in question["candidates"]}
    assert "round 7/7" in first_log and "calibration: timing int4_kernel" in first_log
    (stored,) = (cache / "calibration").glob("*.json")
    stored = json.loads(stored.read_text())
    assert stored["seconds"] < BOUND_S
    # Every candidate the policy offers on this CPU builds from the checkpoint's (symmetric) packing and is timed.
    (answer,) = (a for a in stored["answers"] if a["decision"] == "int4_kernel")
    for t in answer["timings"]:
        assert t.get("error") is None and len(t["decode_s"]) == 7, t
    assert "reusing" in second_log and "round 1/" not in second_log
    assert _decided(second)["calibration.int4_kernel"] == verdict


def test_the_engine_runs_the_kernel_the_calibration_chose(calibration, server_logs):
    cache, env, ((first, _), _) = calibration
    question = _question(env)
    if question is None:
        assert "calibration.int4_kernel" not in _decided(first)
        return
    chosen = next(c for c in question["candidates"] if c["name"] == _decided(first)["calibration.int4_kernel"]["value"])
    process = _start_calibrated(server_logs, "calibrated", cache, env["SERVICE_MODEL"])
    try:
        log = process.log_tail(10**7)
        assert "calibration: reusing" in log and "round 1/" not in log  # warm: the stored timings, no timing
        report = httpx.get(f"{process.url}/v1/hardware", timeout=30).json()
        kernel = _decided(report)["quant.linear_kernel"]
        assert kernel["value"] == chosen["kernel"]
        for name in chosen["kernel"].split("+"):
            for marker in KERNELS[name].log_markers:
                assert marker in log, f"calibration chose {name}, vLLM did not log {marker!r}"
        for key, value in chosen["env"].items():
            assert report["env"].get(key) == value
    finally:
        release(process)


@pytest.mark.parametrize("model", ["demo", "w8a8"])
def test_each_question_of_this_cpu_is_timed_and_its_verdict_decides(tmp_path, model):
    """Whatever this CPU asks about the demo model (zentorch's prepack on Zen, the dtype where bf16 is not native)
    and its W8A8 copy (zentorch or oneDNN on Zen): each one asked is timed, and the report then decides what its
    verdict chose."""
    path = ensure_demo_model(MODELS) if model == "demo" else quantized_demo(MODELS, model)
    env = service_env(tmp_path, model=str(path), calibrate="force")
    questions = {q["decision"]: q for q in _questions(env)}
    report = _detect_calibrate(env)[0]
    decided = _decided(report)
    assert {s.removeprefix("calibration.") for s in decided if s.startswith("calibration.")} == set(questions)
    for name, question in questions.items():
        verdict = decided[f"calibration.{name}"]
        chosen = next(c for c in question["candidates"] if c["name"] == verdict["value"])
        if name == "dtype":
            assert decided["engine.dtype"]["value"] == chosen["settings"]["dtype"]
        elif name == "backend":
            assert report["backend"]["name"] == chosen["settings"]["backend"]
        elif name == "zentorch_weight_prepack" and report["backend"]["platform"] != ZEN_PLATFORM:
            assert "env.VLLM_ZENTORCH_WEIGHT_PREPACK" not in decided  # the backend's verdict left zentorch
        elif name == "zentorch_weight_prepack":
            assert decided["env.VLLM_ZENTORCH_WEIGHT_PREPACK"]["value"] == chosen["env"]["VLLM_ZENTORCH_WEIGHT_PREPACK"]
        else:
            assert decided["quant.linear_kernel"]["value"] == chosen["kernel"]


def test_the_engine_runs_the_backend_and_dtype_the_calibration_chose(tmp_path, server_logs):
    """The demo model's questions on the live CPU (the backend where it has a lowering, as on Zen, the lowering
    timed in a process of its own; the dtype where bf16 is not native): a server on that cache runs what was chosen,
    read back from every vLLM process (platform) and from vLLM's engine config (dtype), with the chosen backend's
    preload in its own process."""
    env = service_env(tmp_path, model=str(ensure_demo_model(MODELS)), calibrate="auto")
    questions = {q["decision"] for q in _questions(env)}
    report = _detect_calibrate(env)[0]
    decided = _decided(report)
    assert {s.removeprefix("calibration.") for s in decided if s.startswith("calibration.")} == questions
    if not questions & {"backend", "dtype"}:  # neither asked on this CPU: the table's backend and dtype stand
        assert not report["backend"]["reason"].startswith("calibrated")
        return
    if "backend" in questions:
        assert decided["calibration.backend"]["value"] == report["backend"]["name"]
        assert "2 processes: another backend's candidates in their own" in decided["calibration.backend"]["reason"]
    process = _start_calibrated(server_logs, "calibrated/demo", tmp_path, env["SERVICE_MODEL"])
    try:
        served = httpx.get(f"{process.url}/v1/hardware", timeout=30).json()
        log = process.log_tail(10**7)
    finally:
        release(process)
    assert "calibration: reusing" in log and "round 1/" not in log
    assert served["backend"] == report["backend"]
    platform = served["backend"]["platform"]
    states = process_states(log)
    assert any(s["process"] == "EngineCore" for s in states), states
    assert {(s["platform"], s["decided_platform"]) for s in states} == {(platform, platform)}, states
    assert f"executing the service again with LD_PRELOAD={served['env']['LD_PRELOAD']}" in log
    assert f"dtype=torch.{decided['engine.dtype']['value']}," in log  # vLLM's engine config line


def test_an_awq_checkpoints_kernels_are_timed_from_its_own_packing(tmp_path):
    """An AWQ int4 config (its layers are built from the config; no weights needed): each candidate is built from
    AutoAWQ's packing through vLLM's conversion at load, and computes what the reference does."""
    model = tmp_path / "awq"
    model.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
    }
    (model / "config.json").write_text(json.dumps(config))
    env = service_env(tmp_path, model=str(model), calibrate="auto")
    question = _question(env)
    report = _detect_calibrate(env)[0]
    if question is None:  # one int4 kernel on this CPU
        assert "calibration.int4_kernel" not in _decided(report)
        return
    assert question["layout"] == "awq"
    (stored,) = (tmp_path / "calibration").glob("*.json")
    (answer,) = json.loads(stored.read_text())["answers"]
    timings = {t["candidate"]: t for t in answer["timings"]}
    assert set(timings) == {c["name"] for c in question["candidates"]}
    for name, t in timings.items():
        assert t.get("error") is None and t["max_rel_err"] < 0.05 and len(t["decode_s"]) == 7, (name, t)
    assert _decided(report)["calibration.int4_kernel"]["value"] in timings


def _time_in_child(candidates: list[dict], act_dtype: str, shapes: list[list[int]]) -> dict[str, dict]:
    """The timing child on the live CPU, one dense question: each candidate's timings, by name."""
    question = {
        "decision": "dtype",
        "default": candidates[0]["name"],
        "candidates": candidates,
        "shapes": shapes,
        "weights": "dense",
        "layout": "compressed-tensors",
        "group_size": None,
        "symmetric": True,
        "act_dtype": act_dtype,
    }
    out = subprocess.run(
        [sys.executable, "-m", "service.startup.calibration_timer"],
        input=json.dumps({"questions": [question], "rounds": 2, "prefill_m": 8}),
        cwd=REPO,
        env=service_env(MODELS),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    (answer,) = json.loads(out.stdout.strip().splitlines()[-1])["answers"]
    return {t["candidate"]: t for t in answer["timings"]}


def test_a_candidate_that_fails_is_excluded_and_the_others_are_timed():
    """The timing child on the live CPU: a candidate it cannot build is reported with why, the rest run."""
    good = {"name": "float32", "settings": {"dtype": "float32"}, "kernel": "float32", "env": {}}
    broken = {"name": "broken", "settings": {"dtype": "no_such_dtype"}, "kernel": "broken", "env": {}}
    timings = _time_in_child([good, broken], "float32", [[256, 256]])
    assert "no_such_dtype" in timings["broken"]["error"] and "decode_s" not in timings["broken"]
    assert len(timings["float32"]["decode_s"]) == 2 and timings["float32"]["max_rel_err"] < 0.05


@pytest.mark.kernels
def test_a_dense_candidate_is_timed_on_the_kernel_its_environment_names():
    """The service's bf16 kernel where a candidate's environment names it, vLLM's GEMM where the next candidate's
    does not (in the same process, after the first registered the kernel): what each engine would run."""
    ours = {"SERVICE_LINEAR_KERNELS": KERNELS["bf16-weights"].vllm_class}
    candidates = [
        {"name": f"{dtype}-{who}", "settings": {"dtype": dtype}, "kernel": dtype, "env": env}
        for who, env in (("ours", ours), ("vllm", {}))
        for dtype in ("bfloat16", "float32")
    ]
    timings = _time_in_child(candidates, "bfloat16", [[256, 512]])
    for name, t in timings.items():
        dtype, who = name.split("-")
        by = "the service's bf16 kernel" if who == "ours" else "vLLM's CPU GEMM dispatch"
        assert t["kernel_class"] == [f"{by}, torch.{dtype}"] and t["max_rel_err"] < 0.05, (name, t)
        assert len(t["decode_s"]) == 2
